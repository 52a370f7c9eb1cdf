//! A `ledger-svc` process for the HTTP contract tests: the binary Cargo built for this
//! package, pointed at a test database, tied to the test process (parent-death signal) and
//! killed on drop. Its stderr is forwarded to the test's captured output.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

/// Longest wait for the service's address line and for `/readyz`, milliseconds.
pub const START_TIMEOUT_MS: u64 = 10_000;
/// Longest wait for the service to exit after SIGTERM, milliseconds.
pub const STOP_TIMEOUT_MS: u64 = 15_000;
/// Per-request timeout of the test client, milliseconds.
pub const CLIENT_TIMEOUT_MS: u64 = 10_000;

/// A running service.
pub struct Service {
    child: Child,
    /// Every stderr line so far (also forwarded to the test's output).
    log: Arc<Mutex<Vec<String>>>,
    /// `http://127.0.0.1:PORT` of the public listener.
    pub public: String,
    /// `http://127.0.0.1:PORT` of the admin listener.
    pub admin: String,
    /// A client without proxies or idle connections (a fresh connection per request).
    pub http: reqwest::Client,
}

/// Options beyond the database URL.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--enable-fault-injection`.
    pub faults: bool,
    /// `--pool-size`, when set.
    pub pool_size: Option<usize>,
    /// `--shutdown-grace-ms`, when set.
    pub shutdown_grace_ms: Option<u64>,
    /// Return once the address line is read, without waiting for a ready `/readyz`
    /// (for a service whose database is unreachable).
    pub no_health_wait: bool,
    /// Further arguments, e.g. `["--lock-timeout-ms", "500"]`.
    pub extra_args: Vec<String>,
    /// Environment variables for the service, e.g. `("RUST_LOG", "off")`.
    pub env: Vec<(String, String)>,
}

/// A response: status, headers and the body parsed as JSON (`Null` when empty).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: serde_json::Value,
    pub raw: String,
}

impl Reply {
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn content_type(&self) -> &str {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    pub fn outcome(&self) -> &str {
        self.body["outcome"].as_str().unwrap_or("")
    }
}

impl Service {
    /// Starts the service on `database_url` and waits for `/readyz`.
    pub async fn start(database_url: &str, options: Options) -> Service {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ledger-svc"));
        command
            .args(["--database-url", database_url])
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if options.faults {
            command.arg("--enable-fault-injection");
        }
        if let Some(size) = options.pool_size {
            command.args(["--pool-size", &size.to_string()]);
        }
        if let Some(grace) = options.shutdown_grace_ms {
            command.args(["--shutdown-grace-ms", &grace.to_string()]);
        }
        command.args(&options.extra_args);
        command.envs(options.env.iter().map(|(name, value)| (name, value)));
        let mut child = scratch_pg::process::spawn_tied(command, None, libc::SIGKILL)
            .expect("spawn ledger-svc");
        let stderr = child.stderr.take().expect("stderr pipe");
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[svc] {line}");
                kept.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        let stdout = child.stdout.take().expect("stdout pipe");
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = sender.send(first);
            }
            for line in lines.map_while(Result::ok) {
                eprintln!("[svc stdout] {line}");
            }
        });
        let line = receiver
            .recv_timeout(Duration::from_millis(START_TIMEOUT_MS))
            .expect("ledger-svc printed its address line");
        let (public, admin) = parse_listening(&line).expect("address line");
        let service = Service {
            child,
            log,
            public: format!("http://{public}"),
            admin: format!("http://{admin}"),
            http: reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(0)
                .timeout(Duration::from_millis(CLIENT_TIMEOUT_MS))
                .build()
                .expect("http client"),
        };
        if options.no_health_wait {
            return service;
        }
        let deadline = Instant::now() + Duration::from_millis(START_TIMEOUT_MS);
        loop {
            let healthy = service
                .http
                .get(format!("{}/readyz", service.public))
                .send()
                .await
                .is_ok_and(|r| r.status() == 200);
            if healthy {
                return service;
            }
            assert!(Instant::now() < deadline, "ledger-svc never became healthy");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The stderr lines written so far that contain `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|line| line.contains(needle))
            .cloned()
            .collect()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL and a panic after [`STOP_TIMEOUT_MS`]).
    pub async fn terminate(&mut self) -> (ExitStatus, Duration) {
        let started = Instant::now();
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status, started.elapsed());
            }
            if started.elapsed() > Duration::from_millis(STOP_TIMEOUT_MS) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("ledger-svc did not stop within {STOP_TIMEOUT_MS} ms of SIGTERM");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends a request and reads the whole response.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
        let response = request.send().await?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let raw = response.text().await?;
        let body = if raw.trim().is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&raw).unwrap_or_else(|e| panic!("body is not JSON ({e}): {raw}"))
        };
        Ok(Reply {
            status,
            headers,
            body,
            raw,
        })
    }

    /// `POST {base}{path}` with the given headers and raw body.
    pub fn post(
        &self,
        base: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        body: impl Into<reqwest::Body>,
    ) -> reqwest::RequestBuilder {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).expect("header name"),
                HeaderValue::from_bytes(value).expect("header value"),
            );
        }
        self.http
            .post(format!("{base}{path}"))
            .headers(map)
            .body(body)
    }

    /// A form-encoded debit: `amount=<amount>` (raw text) as client `client`, key `key`.
    pub async fn debit(&self, account: &str, client: &str, key: &str, amount: &str) -> Reply {
        self.send(self.post(
            &self.public,
            &format!("/accounts/{account}/debits"),
            &[
                ("x-client-id", client.as_bytes()),
                ("idempotency-key", key.as_bytes()),
                ("content-type", b"application/x-www-form-urlencoded"),
            ],
            format!("amount={amount}"),
        ))
        .await
        .expect("debit request")
    }

    /// A JSON grant on the admin listener.
    pub async fn grant(&self, account: &str, key: &str, amount: i64) -> Reply {
        self.send(self.post(
            &self.admin,
            &format!("/accounts/{account}/grants"),
            &[
                ("x-client-id", b"ops"),
                ("idempotency-key", key.as_bytes()),
                ("content-type", b"application/json"),
            ],
            format!("{{\"amount\": {amount}}}"),
        ))
        .await
        .expect("grant request")
    }

    /// `GET {admin}/faults` as JSON (the `faults` array).
    pub async fn faults(&self) -> Reply {
        self.send(self.http.get(format!("{}/faults", self.admin)))
            .await
            .expect("faults request")
    }

    /// Arms a fault; panics unless the service answers 200.
    pub async fn arm(&self, point: &str, spec: serde_json::Value) {
        let reply = self
            .send(
                self.http
                    .put(format!("{}/faults/{point}", self.admin))
                    .header("content-type", "application/json")
                    .body(spec.to_string()),
            )
            .await
            .expect("arm request");
        assert_eq!(reply.status, 200, "{}", reply.raw);
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `listening on A admin B` → (A, B).
pub fn parse_listening(line: &str) -> Option<(String, String)> {
    let rest = line.strip_prefix("listening on ")?;
    let (public, admin) = rest.split_once(" admin ")?;
    Some((public.trim().to_owned(), admin.trim().to_owned()))
}

/// Starts a service with `options` (pool of 4) on a database `database` of its own
/// cluster, fills the pool, restarts PostgreSQL immediately, and asserts that the next
/// eight debits all succeed and the balance counts each debit once.
pub async fn restart_then_debit(database: &str, options: Options) {
    // Its own cluster: the restart must not disturb the other tests' databases.
    let mut cluster = tokio::task::spawn_blocking(|| {
        scratch_pg::Cluster::start(scratch_pg::ClusterOptions::default())
    })
    .await
    .unwrap()
    .expect("start scratch PostgreSQL");
    cluster.create_database(database, None).await.unwrap();
    {
        let client = cluster.connect(database).await.unwrap();
        points_ledger::schema::install(&client).await.unwrap();
        points_ledger::schema::seed(&client).await.unwrap();
    }
    let svc = Service::start(
        &cluster.url(database),
        Options {
            pool_size: Some(4),
            ..options
        },
    )
    .await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    // Fill the pool with several open connections.
    let keys: Vec<String> = (0..4).map(|i| format!("k-{i}")).collect();
    let replies = futures_util::future::join_all(
        keys.iter()
            .map(|key| svc.debit("acct-0001", "app-a", key, "1")),
    )
    .await;
    assert!(replies.iter().all(|r| r.status == 201));

    let mut cluster =
        tokio::task::spawn_blocking(move || cluster.restart_immediate().map(|()| cluster))
            .await
            .unwrap()
            .expect("restart");

    for i in 10..18 {
        let reply = svc
            .debit("acct-0001", "app-a", &format!("k-{i}"), "1")
            .await;
        assert_eq!(
            reply.status, 201,
            "request {i} after the restart: {}",
            reply.raw
        );
    }
    let client = cluster.connect(database).await.unwrap();
    let balance: i64 = client
        .query_one(
            "SELECT balance FROM account WHERE account_id = 'acct-0001'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(balance, 100 - 4 - 8);
    drop(svc);
    cluster.stop(scratch_pg::StopMode::Fast).unwrap();
}
