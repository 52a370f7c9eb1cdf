//! A `ledger-svc` process for a case: started as a child of the harness pointed at the
//! case's own database, tied to the harness's life (parent-death signal) and killed on
//! drop, with its output in a log file; plus a small HTTP client for it (reqwest over
//! loopback, no proxy, a fresh connection per request). What a family sends to it (the
//! ledger's debits, an exchange's orders) is the family's own: it builds the request on
//! [`Service::http`] and sends it with [`Service::send`].
//!
//! The binary is found through `LEDGER_SVC_BIN`, else next to the running executable
//! (`target/release/harness` → `target/release/ledger-svc`), else one folder up (test
//! binaries live in `target/<profile>/deps/`).
//!
//! # Authenticated callers
//!
//! With authentication on ([`ServiceOptions::auth`]; by default the run's choice,
//! [`run_auth`]: the harness's `--auth` or [`AUTH_ENV`]`=1`), the service is started with
//! `--auth-tokens FILE`: [`Service::launch`] makes a random token for each caller, writes
//! only their SHA-256 hashes to FILE (beside the log, `<log>.tokens`) and keeps the
//! tokens in memory. The callers are [`ADMIN_CLIENT`] (`ops`, the only admin: grants,
//! transfers, deposits, fills, fault routes), [`DEFAULT_CLIENT`] (public requests that
//! name no client, e.g. the spot routes and balance reads), and every id of
//! [`ServiceOptions::clients`]: list there each `X-Client-Id` a case sends.
//!
//! [`Service::send`] then attaches `Authorization: Bearer <token>` to every request (see
//! [`Service::authorize`] for which token), so a case's code is the same in both modes.
//! Code that sends on its own (a raw `reqwest` call, the bench's keep-alive clients, the
//! exploration run) passes its request through [`Service::authorize`], or takes a
//! client's token from [`Service::token`] and sets the header itself.
//! [`Service::send_as_is`] sends without adding anything (for a case that shows what a
//! missing or wrong token gets).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::RngExt;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use case_kit::Ctx;
use case_kit::spec::verbs::{Arg, Kind, may};
use points_ledger::TransferMode;

/// Environment variable naming the `ledger-svc` binary to run.
pub const SERVICE_BIN_ENV: &str = "LEDGER_SVC_BIN";
/// Longest wait for the service's address line plus a ready `/readyz` (a database
/// connection answers), milliseconds.
pub const SERVICE_START_TIMEOUT_MS: u64 = 15_000;
/// Longest wait for the service to exit after SIGTERM before it is SIGKILLed, milliseconds.
pub const SERVICE_STOP_TIMEOUT_MS: u64 = 15_000;
/// Per-request timeout of a case's ordinary requests, milliseconds (a case that tests
/// timeouts sets its own on the request).
pub const CLIENT_TIMEOUT_MS: u64 = 10_000;
/// Interval between `/readyz` probes while starting, milliseconds.
const HEALTH_POLL_MS: u64 = 20;
/// How often [`Service::held_within`] looks at a fault point, milliseconds.
pub const HELD_POLL_MS: u64 = 5;

/// Pooled database connections of a service started with default options.
pub const DEFAULT_POOL_SIZE: usize = 16;

/// Environment variable that turns authentication on for every service started with
/// [`Auth::FromRun`]: set and not `0`, `false`, `no` or `off` (the harness's `--auth`
/// sets it too, through [`set_run_auth`]).
pub const AUTH_ENV: &str = "LEDGER_HARNESS_AUTH";
/// The admin caller of an authenticated service: the client id the cases' grants name.
pub const ADMIN_CLIENT: &str = "ops";
/// The caller of public requests that name no `X-Client-Id` (spot routes, balance reads).
pub const DEFAULT_CLIENT: &str = "case-kit";
/// Random bytes in a token the kit makes (shown as twice as many hex digits).
pub const TOKEN_BYTES: usize = 32;

/// Authentication chosen for the whole run (the harness's `--auth`).
static RUN_AUTH: AtomicBool = AtomicBool::new(false);

/// Turns authentication on (or off) for every service of this process started with
/// [`Auth::FromRun`]; the harness calls it for `--auth`.
pub fn set_run_auth(on: bool) {
    RUN_AUTH.store(on, Ordering::SeqCst);
}

/// Whether services started with [`Auth::FromRun`] authenticate their callers:
/// [`set_run_auth`] or [`AUTH_ENV`].
pub fn run_auth() -> bool {
    RUN_AUTH.load(Ordering::SeqCst)
        || std::env::var(AUTH_ENV).is_ok_and(|value| {
            !matches!(
                value.trim().to_ascii_lowercase().as_str(),
                "" | "0" | "false" | "no" | "off"
            )
        })
}

/// Whether a service authenticates its callers (`--auth-tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Auth {
    /// As the run says ([`run_auth`]): the default, so every case runs both ways.
    #[default]
    FromRun,
    /// Never: `X-Client-Id` trusted as declared (a case that shows why that is unsafe).
    Off,
    /// Always.
    On,
}

/// How to start the service.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// Pass `--enable-fault-injection` (the admin fault routes exist only then).
    pub fault_injection: bool,
    /// `--pool-size`: pooled database connections (count them in the case's
    /// [`case_kit::Case::connections`]).
    pub pool_size: usize,
    /// Further command-line arguments, e.g. `["--redeem-stripes", "64"]`.
    pub extra_args: Vec<String>,
    /// Whether to start it with `--auth-tokens` (see the module docs).
    pub auth: Auth,
    /// The client ids the case sends in `X-Client-Id` (besides [`ADMIN_CLIENT`] and
    /// [`DEFAULT_CLIENT`], always there): with authentication on, each gets a token, and
    /// a request naming an id not listed goes without one (401).
    pub clients: Vec<String>,
    /// Client ids of [`ServiceOptions::clients`] whose tokens may also use the admin
    /// listener (besides [`ADMIN_CLIENT`], always an admin): a caller that grants under
    /// its own id, as the exploration run's clients do.
    pub admins: Vec<String>,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            fault_injection: false,
            pool_size: DEFAULT_POOL_SIZE,
            extra_args: Vec::new(),
            auth: Auth::FromRun,
            clients: Vec::new(),
            admins: Vec::new(),
        }
    }
}

impl ServiceOptions {
    /// These options with `clients` listed in [`ServiceOptions::clients`].
    pub fn with_clients(mut self, clients: &[&str]) -> ServiceOptions {
        self.clients
            .extend(clients.iter().map(|client| client.to_string()));
        self
    }
}

/// The tokens of an authenticated service: kept in memory, only their hashes on disk.
struct Tokens {
    /// Client id → token.
    by_client: BTreeMap<String, String>,
    /// The `--auth-tokens` file.
    file: PathBuf,
}

impl Tokens {
    /// A fresh random token for each of [`ADMIN_CLIENT`], [`DEFAULT_CLIENT`] and
    /// `clients`, and the token file for them at `file` (mode 0600); [`ADMIN_CLIENT`] and
    /// `admins` are admins.
    fn write(file: PathBuf, clients: &[String], admins: &[String]) -> anyhow::Result<Tokens> {
        let mut rng = rand::rng();
        let mut by_client = BTreeMap::new();
        for client in [ADMIN_CLIENT, DEFAULT_CLIENT]
            .into_iter()
            .chain(clients.iter().map(String::as_str))
        {
            by_client.entry(client.to_owned()).or_insert_with(|| {
                let bytes: [u8; TOKEN_BYTES] = rng.random();
                hex(&bytes)
            });
        }
        let text = token_file_text(&by_client, admins);
        use std::os::unix::fs::OpenOptionsExt;
        let mut out = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&file)
            .with_context(|| format!("writing {}", file.display()))?;
        out.write_all(text.as_bytes())
            .with_context(|| format!("writing {}", file.display()))?;
        Ok(Tokens { by_client, file })
    }
}

/// The `--auth-tokens` file for `by_client` (client id → token): one line per caller,
/// `<sha256-hex of the token> <client id> <yes|no>`, [`ADMIN_CLIENT`] and `admins` the
/// admins.
fn token_file_text(by_client: &BTreeMap<String, String>, admins: &[String]) -> String {
    let mut text = String::from("# written by the launch crate: sha256-of-token client-id admin\n");
    for (client, token) in by_client {
        let admin = if client == ADMIN_CLIENT || admins.contains(client) {
            "yes"
        } else {
            "no"
        };
        text.push_str(&format!(
            "{} {client} {admin}\n",
            hex(&Sha256::digest(token.as_bytes()))
        ));
    }
    text
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A response as a case sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Whether `Idempotent-Replayed: true` was present.
    pub replayed: bool,
    /// The JSON body (`Null` if it was not JSON).
    pub body: Value,
}

impl Reply {
    /// The body's `outcome` member (empty if absent).
    pub fn outcome(&self) -> &str {
        self.body["outcome"].as_str().unwrap_or("")
    }

    /// The body's member `name` as an integer, if it is one.
    pub fn integer(&self, name: &str) -> Option<i64> {
        self.body[name].as_i64()
    }

    /// `<status> <outcome>`, e.g. `409 INSUFFICIENT`: what a check compares, since 409 is
    /// also used for other conflicts (SPEC §4: clients read `outcome`).
    pub fn status_outcome(&self) -> String {
        format!("{} {}", self.status, self.outcome())
    }
}

/// The `fault-injection=yes` argument of a verb that starts the service: with it the
/// service serves its `/faults` routes ([`ServiceOptions::fault_injection`]).
pub const FAULT_INJECTION: Arg = may(
    "fault-injection",
    Kind::OneOf(&["yes"]),
    "no `/faults` routes",
);

/// A fault's state as reported by `GET /faults` on the admin listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FaultState {
    /// Hook point name.
    pub point: String,
    /// Transfers it will still fire for.
    pub remaining: u32,
    /// Times it fired since armed.
    pub fired: u64,
    /// Transfers inside its hold right now.
    pub holding: u32,
}

/// The `ledger-svc` a case's steps started: put there by the step that starts it, used
/// by the steps after it on any session (each takes a clone of the handle, so a request
/// held at a fault point keeps no other step from it), taken out again by a step that
/// stops it or, at the latest, dropped when the case ends (the handle's drop kills it).
#[derive(Default)]
pub struct ServiceSlot(tokio::sync::Mutex<Option<Arc<Service>>>);

impl ServiceSlot {
    /// The slot itself, held while the guard lives (a starting step checks and fills it).
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, Option<Arc<Service>>> {
        self.0.lock().await
    }

    /// The running service, if a step started one.
    pub async fn current(&self) -> Option<Arc<Service>> {
        self.0.lock().await.clone()
    }

    /// Takes the service out of the slot for `op` (a step that stops or kills it),
    /// once `held`, the step's own handle, is let go.
    ///
    /// Errors: no service running; a request of another step still holds it.
    pub async fn take(&self, held: Arc<Service>, op: &str) -> Result<Service, String> {
        drop(held);
        let taken = self.0.lock().await.take().ok_or("no service running")?;
        Arc::try_unwrap(taken).map_err(|_| format!("{op}: a request still holds the service"))
    }

    /// Lets go of the service when the case ends or is cancelled: it is killed once no
    /// step task holds it any more (the handle's drop).
    pub fn end(&self) {
        case_kit::drop_if_free(&self.0);
    }
}

/// A running `ledger-svc`.
pub struct Service {
    child: Option<Child>,
    public: SocketAddr,
    admin: SocketAddr,
    log_path: PathBuf,
    http: reqwest::Client,
    tokens: Option<Tokens>,
}

/// The tokens of a service started with `options` and the log file `log_path`: written
/// beside the log (`<log>.tokens`) when authentication is on for it ([`Auth`]), `None`
/// otherwise.
///
/// Errors: the token file could not be written.
fn auth_tokens(log_path: &Path, options: &ServiceOptions) -> anyhow::Result<Option<Tokens>> {
    match options.auth {
        Auth::On => true,
        Auth::Off => false,
        Auth::FromRun => run_auth(),
    }
    .then(|| {
        Tokens::write(
            log_path.with_extension("tokens"),
            &options.clients,
            &options.admins,
        )
    })
    .transpose()
}

/// The command line of `ledger-svc` (`binary`) on `database_url`: both listeners on free
/// loopback ports, the options' pool size, extra arguments, fault injection and token
/// file; standard output piped (its first line names the addresses), standard error to
/// `log`.
///
/// Errors: the log file handle could not be duplicated.
fn service_command(
    binary: &Path,
    database_url: &str,
    options: &ServiceOptions,
    log: &File,
    tokens: Option<&Tokens>,
) -> anyhow::Result<Command> {
    let mut command = Command::new(binary);
    command
        .arg("--database-url")
        .arg(database_url)
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--pool-size")
        .arg(options.pool_size.to_string())
        .args(&options.extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log.try_clone()?);
    if options.fault_injection {
        command.arg("--enable-fault-injection");
    }
    if let Some(tokens) = tokens {
        command.arg("--auth-tokens").arg(&tokens.file);
    }
    Ok(command)
}

/// The `ledger-svc` binary: `LEDGER_SVC_BIN`, else beside the running executable, else
/// one folder up from it.
///
/// Errors: none of these exists.
pub fn service_binary() -> anyhow::Result<PathBuf> {
    case_kit::process::locate_binary("ledger-svc", SERVICE_BIN_ENV)
}

impl Service {
    /// Starts `ledger-svc` on the case's database, listening on free loopback ports, and
    /// waits until `/readyz` answers 200 (at most [`SERVICE_START_TIMEOUT_MS`]). Its
    /// stdout and stderr go to [`Ctx::log_file`]`("ledger-svc")`. The service runs in the
    /// case's transfer mode (`--transfer-mode`: the run's [`TransferMode`] choice, see
    /// [`Ctx::choice`]) unless `options.extra_args`
    /// names one.
    ///
    /// Errors: binary missing, spawn failure, no address line, never healthy; the child
    /// is killed in each case.
    pub async fn start(ctx: &Ctx, options: ServiceOptions) -> anyhow::Result<Service> {
        let log_path = ctx
            .log_file("ledger-svc")
            .context("creating the log folder")?;
        let mut options = options;
        let mode = ctx
            .choice::<TransferMode>()
            .unwrap_or_else(TransferMode::from_env);
        if mode != TransferMode::Statements
            && !options
                .extra_args
                .iter()
                .any(|arg| arg == "--transfer-mode")
        {
            options
                .extra_args
                .extend(["--transfer-mode".to_owned(), mode.as_str().to_owned()]);
        }
        Service::launch(&ctx.database_url()?, log_path, options).await
    }

    /// [`Service::start`] for any database URL and log file (the bench uses it).
    ///
    /// Errors: as [`Service::start`].
    pub async fn launch(
        database_url: &str,
        log_path: PathBuf,
        options: ServiceOptions,
    ) -> anyhow::Result<Service> {
        let binary = service_binary()?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let tokens = auth_tokens(&log_path, &options)?;
        let command = service_command(&binary, database_url, &options, &log, tokens.as_ref())?;
        let mut child = scratch_pg::process::spawn_tied(command, None, nix::libc::SIGKILL)
            .with_context(|| format!("starting {}", binary.display()))?;
        let stdout = child.stdout.take();
        let mut service = Service {
            child: Some(child),
            public: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            log_path,
            http: reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(0)
                .timeout(Duration::from_millis(CLIENT_TIMEOUT_MS))
                .build()?,
            tokens,
        };
        let deadline = Instant::now() + Duration::from_millis(SERVICE_START_TIMEOUT_MS);
        let line = first_line(stdout, log, deadline).await.with_context(|| {
            format!(
                "ledger-svc printed no address line (log: {})",
                service.log_path.display()
            )
        })?;
        let (public, admin) = parse_listening(&line)
            .ok_or_else(|| anyhow!("unexpected first line from ledger-svc: {line:?}"))?;
        service.public = public;
        service.admin = admin;
        service.wait_ready(deadline).await?;
        Ok(service)
    }

    /// Probes `/readyz` every [`HEALTH_POLL_MS`] until it answers 200.
    ///
    /// Errors: not ready by `deadline`.
    async fn wait_ready(&self, deadline: Instant) -> anyhow::Result<()> {
        loop {
            let healthy = self
                .http
                .get(self.public_url("/readyz"))
                .send()
                .await
                .is_ok_and(|response| response.status() == 200);
            if healthy {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "ledger-svc was not ready (/readyz) within {SERVICE_START_TIMEOUT_MS} ms \
                     (log: {})",
                    self.log_path.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(HEALTH_POLL_MS)).await;
        }
    }

    /// `http://<public address><path>`.
    pub fn public_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.public)
    }

    /// The process id of the running service (`None` once stopped); the bench reads its
    /// CPU time by it.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|child| child.id())
    }

    /// The public listener's address (for a proxy in front of it).
    pub fn public_addr(&self) -> SocketAddr {
        self.public
    }

    /// `http://<admin address><path>`.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.admin)
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The HTTP client the service's calls go through (no proxy, no idle connections
    /// kept, [`CLIENT_TIMEOUT_MS`] per request unless the request sets its own).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Sends `request` (built on [`Service::http`]) through [`Service::authorize`] and
    /// reads the whole reply.
    ///
    /// Errors: the transport's error (`is_timeout()` for a timeout; a connection closed
    /// without a response is another error).
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
        read_reply(self.authorize(request)).await
    }

    /// Sends `request` exactly as built, without a token, and reads the whole reply.
    ///
    /// Errors: as [`Service::send`].
    pub async fn send_as_is(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<Reply, reqwest::Error> {
        read_reply(request).await
    }

    /// Whether the service was started with `--auth-tokens`.
    pub fn authenticated(&self) -> bool {
        self.tokens.is_some()
    }

    /// Every (client id, bearer token) of the service, ordered by id; none without
    /// authentication. For clients that build their own requests (the exploration run).
    pub fn tokens(&self) -> impl Iterator<Item = (&str, &str)> {
        self.tokens.iter().flat_map(|tokens| {
            tokens
                .by_client
                .iter()
                .map(|(client, token)| (client.as_str(), token.as_str()))
        })
    }

    /// The bearer token of `client_id` (`None` without authentication, or for an id that
    /// has none: see [`ServiceOptions::clients`]).
    pub fn token(&self, client_id: &str) -> Option<&str> {
        let tokens = self.tokens.as_ref()?;
        tokens.by_client.get(client_id).map(String::as_str)
    }

    /// The `--auth-tokens` file (hashes only), when authenticated.
    pub fn token_file(&self) -> Option<&Path> {
        self.tokens.as_ref().map(|tokens| tokens.file.as_path())
    }

    /// `request` with the right `Authorization: Bearer` for it when the service
    /// authenticates (unchanged otherwise, or when it already has an `Authorization`
    /// header): the token of its `X-Client-Id`; without one, [`ADMIN_CLIENT`]'s for the
    /// admin listener and [`DEFAULT_CLIENT`]'s for anything else (the public listener, a
    /// proxy in front of it). An `X-Client-Id` without a token goes without one (the
    /// service answers 401), and the kit says so on stderr and in the service's log.
    /// Works for a request built on any client (the bench's own).
    pub fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        let Some(tokens) = &self.tokens else {
            return request;
        };
        // A request whose body cannot be cloned (a stream) or that does not build is sent
        // as it is; reqwest then reports its own error.
        let Some(built) = request.try_clone().and_then(|copy| copy.build().ok()) else {
            return request;
        };
        if built.headers().contains_key(AUTHORIZATION) {
            return request;
        }
        let declared = built
            .headers()
            .get("x-client-id")
            .and_then(|value| value.to_str().ok())
            .map(str::trim);
        let to_admin = built.url().port() == Some(self.admin.port());
        let client = declared.unwrap_or(if to_admin {
            ADMIN_CLIENT
        } else {
            DEFAULT_CLIENT
        });
        match tokens.by_client.get(client) {
            Some(token) => request.bearer_auth(token),
            None => {
                let warning = format!(
                    "case-kit: no token for client id {client:?}: list it in \
                     ServiceOptions::clients; sending without one"
                );
                eprintln!("{warning}");
                if let Ok(mut log) = OpenOptions::new().append(true).open(&self.log_path) {
                    let _ = writeln!(log, "{warning}");
                }
                request
            }
        }
    }

    /// Arms a fault at `point` (`PUT /faults/{point}`), e.g.
    /// `{"action": "close", "hold_ms": 1500, "count": 1}`.
    ///
    /// Errors: transport errors, or a status other than 200 (e.g. 404 when the service
    /// was started without fault injection).
    pub async fn arm_fault(&self, point: impl Display, spec: Value) -> anyhow::Result<()> {
        let request = self
            .http
            .put(self.admin_url(&format!("/faults/{point}")))
            .header(CONTENT_TYPE, "application/json")
            .body(spec.to_string());
        let reply = self.send(request).await?;
        if reply.status != 200 {
            bail!("arming a fault at {point} answered {}", reply.status);
        }
        Ok(())
    }

    /// The state of the fault at `point` (`GET /faults`).
    ///
    /// Errors: transport errors, or an unexpected body.
    pub async fn fault_state(&self, point: impl Display) -> anyhow::Result<FaultState> {
        let reply = self.send(self.http.get(self.admin_url("/faults"))).await?;
        let states: Vec<FaultState> =
            serde_json::from_value(reply.body["faults"].clone()).context("reading GET /faults")?;
        states
            .into_iter()
            .find(|state| state.point == point.to_string())
            .ok_or_else(|| anyhow!("GET /faults does not list {point}"))
    }

    /// Requests held at fault point `point` now (`GET /faults`: the points' `holding`),
    /// or at every point for `None`.
    ///
    /// Errors: transport errors.
    pub async fn holding(&self, point: Option<&str>) -> Result<u64, reqwest::Error> {
        let reply = self.send(self.http.get(self.admin_url("/faults"))).await?;
        let states = reply.body["faults"].as_array().cloned().unwrap_or_default();
        Ok(states
            .iter()
            .filter(|s| point.is_none_or(|p| s["point"] == p))
            .filter_map(|s| s["holding"].as_u64())
            .sum())
    }

    /// The state of the fault at `point` once it holds at least one transfer, looking
    /// every [`HELD_POLL_MS`]. `limit` only stops a hang:
    /// when nothing is held by then, the state as it is (`holding` 0) is returned and the
    /// caller's check decides.
    ///
    /// Errors: transport errors, or an unexpected body.
    pub async fn held_within(
        &self,
        point: impl Display,
        limit: Duration,
    ) -> anyhow::Result<FaultState> {
        let point = point.to_string();
        let look = async {
            loop {
                let state = self.fault_state(&point).await?;
                if state.holding >= 1 {
                    return anyhow::Ok(state);
                }
                tokio::time::sleep(Duration::from_millis(HELD_POLL_MS)).await;
            }
        };
        match tokio::time::timeout(limit, look).await {
            Ok(state) => state,
            Err(_) => self.fault_state(&point).await,
        }
    }

    /// Releases the transfers paused at `point`; returns how many were holding.
    ///
    /// Errors: transport errors, or a status other than 200.
    pub async fn release_fault(&self, point: impl Display) -> anyhow::Result<u64> {
        let reply = self
            .send(
                self.http
                    .post(self.admin_url(&format!("/faults/{point}/release"))),
            )
            .await?;
        if reply.status != 200 {
            bail!("releasing {point} answered {}", reply.status);
        }
        Ok(reply.body["released"].as_u64().unwrap_or(0))
    }

    /// `GET /batch` on the admin listener: the batch mode's queue and the batch sizes seen
    /// (`ledger-svc/src/http/batch.rs`).
    ///
    /// Errors: transport errors.
    pub async fn batch_state(&self) -> anyhow::Result<Value> {
        Ok(self
            .send(self.http.get(self.admin_url("/batch")))
            .await?
            .body)
    }

    /// Holds (`true`, `PUT /batch/hold`) or releases (`DELETE`) the batch mode's queue: no
    /// drainer takes a new batch while it is held (fault injection only).
    ///
    /// Errors: transport errors, or a status other than 200 (409 outside the batch mode,
    /// 404 without fault injection).
    pub async fn hold_batches(&self, held: bool) -> anyhow::Result<()> {
        let url = self.admin_url("/batch/hold");
        let request = if held {
            self.http.put(url)
        } else {
            self.http.delete(url)
        };
        let reply = self.send(request).await?;
        if reply.status != 200 {
            bail!("/batch/hold answered {}", reply.status);
        }
        Ok(())
    }

    /// Reads `GET /batch` every [`HELD_POLL_MS`] until `count` requests are queued;
    /// `limit` only stops a hang: then the count last seen is returned and the caller's
    /// check decides.
    ///
    /// Errors: transport errors.
    pub async fn queued_within(&self, count: u64, limit: Duration) -> anyhow::Result<u64> {
        let look = async {
            loop {
                let queued = self.batch_state().await?["queued"].as_u64().unwrap_or(0);
                if queued >= count {
                    return anyhow::Ok(queued);
                }
                tokio::time::sleep(Duration::from_millis(HELD_POLL_MS)).await;
            }
        };
        match tokio::time::timeout(limit, look).await {
            Ok(queued) => queued,
            Err(_) => Ok(self.batch_state().await?["queued"].as_u64().unwrap_or(0)),
        }
    }

    /// Sends SIGTERM and waits for the exit (at most [`SERVICE_STOP_TIMEOUT_MS`], then
    /// SIGKILL). Returns the exit status.
    ///
    /// Errors: the service did not stop in time (it was killed), or waiting failed.
    pub async fn stop(mut self) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("ledger-svc was already stopped");
        };
        // Our own child, not yet reaped, so the pid cannot have been reused.
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM)
            .context("sending SIGTERM to ledger-svc")?;
        let deadline = Instant::now() + Duration::from_millis(SERVICE_STOP_TIMEOUT_MS);
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("ledger-svc did not exit within {SERVICE_STOP_TIMEOUT_MS} ms of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(HEALTH_POLL_MS)).await;
        }
    }

    /// SIGKILL: the service dies at once, mid-request if need be (its open transactions
    /// end with their connections, and PostgreSQL rolls them back). Returns the exit
    /// status (killed by signal 9).
    ///
    /// Errors: waiting for the child failed, or it was already stopped.
    pub fn kill(mut self) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("ledger-svc was already stopped");
        };
        child.kill().context("sending SIGKILL to ledger-svc")?;
        Ok(child.wait()?)
    }

    /// Sends SIGKILL now, without waiting for the exit, while requests of the caller may
    /// still be in flight on this service (a kill in the middle of a batch);
    /// [`Service::kill`] then reaps it and returns its status.
    ///
    /// Errors: the service was already stopped, or the signal could not be sent.
    pub fn sigkill_now(&self) -> anyhow::Result<()> {
        let Some(child) = &self.child else {
            bail!("ledger-svc was already stopped");
        };
        // Our own child, not yet reaped, so the pid cannot have been reused.
        kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL)
            .context("sending SIGKILL to ledger-svc")
    }

    /// [`Service::stop`], recording the check that the service exited with status 0
    /// on SIGTERM (its graceful, bounded shutdown).
    ///
    /// Errors: see [`Service::stop`].
    pub async fn stop_checked(self, ctx: &mut Ctx) -> anyhow::Result<()> {
        let status = self.stop().await?;
        ctx.check(
            "ledger-svc stopped on SIGTERM with status 0",
            status.success(),
            status,
        );
        Ok(())
    }
}

impl Drop for Service {
    /// A service not stopped with [`Service::stop`] (a failed check, a case error) is
    /// killed here, so none outlives its case.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends `request` (built on a [`Service::http`] client) and reads the whole reply; for
/// callers that keep the client and the address past the [`Service`] handle (the
/// explorer, whose service is killed and restarted under it).
///
/// Errors: the transport's error (`is_timeout()`, `is_connect()`, or another).
pub async fn read_reply(request: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
    let response = request.send().await?;
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|value| value == "true");
    let bytes = response.bytes().await?;
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok(Reply {
        status,
        replayed,
        body,
    })
}

/// Reads the child's first stdout line (copying it and everything after it to `log`) on a
/// thread of its own; waits for it until `deadline`.
async fn first_line(
    stdout: Option<std::process::ChildStdout>,
    mut log: File,
    deadline: Instant,
) -> anyhow::Result<String> {
    let stdout = stdout.ok_or_else(|| anyhow!("no stdout pipe"))?;
    let (sender, receiver) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("ledger-svc-stdout".into())
        .spawn(move || {
            let mut sender = Some(sender);
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                if let Some(sender) = sender.take() {
                    let _ = sender.send(line);
                }
            }
        })?;
    let wait = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(wait, receiver).await {
        Ok(Ok(line)) => Ok(line),
        Ok(Err(_)) => bail!("ledger-svc closed its stdout (it exited)"),
        Err(_) => bail!("no address line within {SERVICE_START_TIMEOUT_MS} ms"),
    }
}

/// `listening on A admin B` → (A, B).
fn parse_listening(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let rest = line.strip_prefix("listening on ")?;
    let (public, admin) = rest.split_once(" admin ")?;
    Some((public.trim().parse().ok()?, admin.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_holds_hashes_only() {
        let dir = std::env::temp_dir().join(format!("case-kit-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("svc.tokens");
        let tokens = Tokens::write(
            file.clone(),
            &["app-a".into(), "ops".into()],
            &["app-a".into()],
        )
        .unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&file).unwrap().permissions(),
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(mode & 0o777, 0o600);
        let clients: Vec<&str> = tokens.by_client.keys().map(String::as_str).collect();
        assert_eq!(clients, ["app-a", DEFAULT_CLIENT, ADMIN_CLIENT]);
        for (client, token) in &tokens.by_client {
            assert_eq!(token.len(), 2 * TOKEN_BYTES);
            assert!(
                !text.contains(token.as_str()),
                "{client}'s token is on disk"
            );
            let admin = if client == ADMIN_CLIENT || client == "app-a" {
                "yes"
            } else {
                "no"
            };
            let line = format!(
                "{} {client} {admin}",
                hex(&Sha256::digest(token.as_bytes()))
            );
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in:\n{text}"
            );
        }
        // `printf '%s' test | sha256sum`.
        assert_eq!(
            hex(&Sha256::digest(b"test")),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    #[test]
    fn address_line() {
        let (public, admin) =
            parse_listening("listening on 127.0.0.1:4000 admin 127.0.0.1:4001").unwrap();
        assert_eq!((public.port(), admin.port()), (4000, 4001));
        assert!(parse_listening("listening on 127.0.0.1:4000").is_none());
    }
}
