//! The service's bounds and honest errors (SPEC §4), against the real binary and
//! a real PostgreSQL: one bound per request over every wait it queues behind (pool, lock
//! behind another waiter), bounded lock, statement and idle-in-transaction waits (503
//! `UNKNOWN` with `Retry-After`, nothing recorded, the same key later executed once), liveness apart
//! from readiness (also with the database stopped), SQLSTATE 22003 blamed by where it
//! comes from, a pause without `hold_ms`, the request log line (also for a client that
//! went away, and filtered by `RUST_LOG`), and key retention (the expired key, and the
//! record removed by hand). Every time a check compares is the service's own
//! (`duration_ms` of its request log): a loaded machine delays the client, not the claim.

mod common;

use std::time::{Duration, Instant};

use serde_json::json;

use common::TestDb;
use common::service::{Options, Reply, Service};

const FORM: (&str, &[u8]) = ("content-type", b"application/x-www-form-urlencoded");

fn assert_problem(reply: &Reply, status: u16, outcome: &str, what: &str) {
    assert_eq!(reply.status, status, "{what}: {}", reply.raw);
    assert_eq!(
        reply.content_type(),
        "application/problem+json",
        "{what}: {}",
        reply.raw
    );
    assert_eq!(reply.outcome(), outcome, "{what}: {}", reply.raw);
    let text = reply.raw.to_lowercase();
    for driver_text in ["sqlstate", "db error", "postgres", "tokio", "trigger"] {
        assert!(!text.contains(driver_text), "{what}: driver text: {text}");
    }
}

fn with_args(args: &[&str]) -> Options {
    Options {
        extra_args: args.iter().map(|a| a.to_string()).collect(),
        ..Options::default()
    }
}

async fn get(svc: &Service, base: &str, path: &str) -> Reply {
    svc.send(svc.http.get(format!("{base}{path}")))
        .await
        .unwrap()
}

/// Request log lines containing `needle` (the ones with a duration).
fn request_lines(svc: &Service, needle: &str) -> Vec<String> {
    svc.log_lines(needle)
        .into_iter()
        .filter(|line| line.contains(" duration_ms="))
        .collect()
}

/// `GET {base}{path}` and its `duration_ms` on the service's clock (the request line it
/// adds among those containing `needle`).
async fn timed_get(svc: &Service, base: &str, path: &str, needle: &str) -> (Reply, u64) {
    let seen = request_lines(svc, needle).len();
    let reply = get(svc, base, path).await;
    (reply, service_ms(svc, needle, seen + 1).await)
}

/// `duration_ms` of the `nth` (1-based) request log line containing `needle`: the
/// service's own clock, from the request's arrival to its answer (waits for the line,
/// which is written as the response is handed over).
async fn service_ms(svc: &Service, needle: &str, nth: usize) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = request_lines(svc, needle);
        if let Some(line) = lines.get(nth - 1) {
            return line
                .split_whitespace()
                .find_map(|field| field.strip_prefix("duration_ms="))
                .and_then(|ms| ms.parse().ok())
                .unwrap_or_else(|| panic!("no duration_ms in {line}"));
        }
        assert!(
            Instant::now() < deadline,
            "no request line {nth} with {needle}: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One bound per request: three debits queue on the held `sys-redeem` row (two behind
/// another waiter) and one more waits for the last pooled connection; the lock and
/// statement bounds are far longer, so only the request bound can end them. Each is
/// answered 503 `request-timeout` within the bound plus a slack smaller than the bound
/// (a second wait cannot pass), on the service's clock, records nothing, and executes
/// once later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bound_per_request_over_every_wait() {
    const BOUND_MS: u64 = 2_000;
    const SLACK_MS: u64 = 1_000;
    let db = TestDb::new("b_request").await;
    let mut options = with_args(&[
        "--request-timeout-ms",
        "2000",
        "--lock-timeout-ms",
        "20000",
        "--statement-timeout-ms",
        "30000",
    ]);
    options.pool_size = Some(3);
    let svc = Service::start(&db.url(), options).await;
    let accounts = ["acct-0001", "acct-0002", "acct-0003", "acct-0004"];
    for (n, account) in accounts.iter().enumerate() {
        let grant = svc.grant(account, &format!("g-{n}"), 100).await;
        assert_eq!(grant.status, 201, "{}", grant.raw);
    }
    let before = db.recorded().await;
    let holder = db.connect().await;
    holder
        .batch_execute(
            "BEGIN; UPDATE account SET balance = balance WHERE account_id = 'sys-redeem'",
        )
        .await
        .unwrap();
    let keys = ["q-1", "q-2", "q-3", "q-4"];
    let replies = futures_util::future::join_all(
        accounts
            .iter()
            .zip(keys)
            .map(|(account, key)| svc.debit(account, "app-a", key, "10")),
    )
    .await;
    for (key, reply) in keys.iter().zip(&replies) {
        assert_problem(reply, 503, "UNKNOWN", key);
        assert_eq!(
            reply.body["type"], "urn:ledger:problem:request-timeout",
            "{key}: {}",
            reply.raw
        );
        assert_eq!(reply.body["request_timeout_ms"], BOUND_MS, "{key}");
        assert_eq!(reply.headers.get("retry-after").unwrap(), "1");
        let took = service_ms(&svc, &format!(" key={key} "), 1).await;
        assert!(
            (BOUND_MS..=BOUND_MS + SLACK_MS).contains(&took),
            "{key} answered after {took} ms on the service's clock"
        );
    }
    assert_eq!(db.recorded().await, before, "nothing recorded");
    holder.batch_execute("COMMIT").await.unwrap();
    for (account, key) in accounts.iter().zip(keys) {
        let executed = svc.debit(account, "app-a", key, "10").await;
        assert_eq!(executed.status, 201, "{key}: {}", executed.raw);
        assert!(!executed.replayed(), "{key}: executed now, once");
    }
    let mut client = db.connect().await;
    assert!(
        points_ledger::reconcile(&mut client)
            .await
            .unwrap()
            .is_clean()
    );
}

/// The service's own database sessions (`application_name` `ledger-svc`) in the test's
/// database (the cluster is shared with the binary's other tests).
async fn service_backends(db: &TestDb) -> Vec<i32> {
    db.client
        .query(
            "SELECT pid FROM pg_stat_activity \
             WHERE application_name = 'ledger-svc' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Sends `signal` to each of `pids` (server processes of the test's own cluster); one
/// that has ended since it was listed (a connection closed meanwhile) is passed over.
fn signal_all(pids: &[i32], signal: libc::c_int) {
    for pid in pids {
        // SAFETY: kill(2) with a pid the cluster reported and a valid signal number.
        let sent = unsafe { libc::kill(*pid, signal) };
        let gone = std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        assert!(sent == 0 || gone, "kill({pid}, {signal})");
    }
}

/// A database session that stops answering (its server process stopped with SIGSTOP, as
/// a frozen host or a half-open connection would leave it) cannot hold a request past its
/// bound: a request whose pooled connection must first be verified (idle for a second)
/// is answered 503 `request-timeout` within the bound and runs nothing; a request whose
/// transaction stops mid-way is answered 503 `UNKNOWN` (`unavailable`: outcome unknown)
/// once the cancel grace has passed. Resumed, the cancelled transaction rolls back, and
/// the same key then executes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_stops_answering_cannot_hold_a_request() {
    const BOUND_MS: u64 = 1_000;
    const GRACE_MS: u64 = 1_000; // ledger-svc's CANCEL_GRACE_MS
    const SLACK_MS: u64 = 1_000;
    let db = TestDb::new("b_stopped").await;
    let mut options = with_args(&["--request-timeout-ms", "1000"]);
    options.pool_size = Some(1);
    let svc = Service::start(&db.url(), options).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    let before = db.recorded().await;

    // The pooled connection sits idle past the verification threshold; every session of
    // the service is stopped.
    let backends = service_backends(&db).await;
    assert!(!backends.is_empty(), "no session of the service");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    signal_all(&backends, libc::SIGSTOP);
    let refused = svc.debit("acct-0001", "app-a", "k-1", "10").await;
    signal_all(&backends, libc::SIGCONT);
    assert_problem(
        &refused,
        503,
        "UNKNOWN",
        "verification of a stopped session",
    );
    assert_eq!(
        refused.body["type"], "urn:ledger:problem:request-timeout",
        "{}",
        refused.raw
    );
    let took = service_ms(&svc, " key=k-1 ", 1).await;
    assert!(
        (BOUND_MS..BOUND_MS + SLACK_MS).contains(&took),
        "answered after {took} ms on the service's clock"
    );
    assert_eq!(db.recorded().await, before, "nothing ran");

    // A transaction that stops while it waits on a lock.
    let holder = db.connect().await;
    holder
        .batch_execute(
            "BEGIN; UPDATE account SET balance = balance WHERE account_id = 'sys-redeem'",
        )
        .await
        .unwrap();
    let pending = tokio::spawn({
        let request = svc.post(
            &svc.public,
            "/accounts/acct-0001/debits",
            &[("x-client-id", b"app-a"), ("idempotency-key", b"k-2"), FORM],
            "amount=10",
        );
        let http = svc.http.clone();
        async move { http.execute(request.build().unwrap()).await }
    });
    let waiting = loop {
        let rows = db
            .client
            .query(
                "SELECT pid FROM pg_stat_activity \
                 WHERE application_name = 'ledger-svc' AND datname = current_database() \
                 AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap();
        if let Some(row) = rows.first() {
            break vec![row.get::<_, i32>(0)];
        }
        assert!(
            !pending.is_finished(),
            "the debit was answered before it waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    signal_all(&waiting, libc::SIGSTOP);
    let unknown = pending.await.unwrap().expect("an answer");
    signal_all(&waiting, libc::SIGCONT);
    assert_eq!(unknown.status().as_u16(), 503);
    let body: serde_json::Value = serde_json::from_slice(&unknown.bytes().await.unwrap()).unwrap();
    assert_eq!(body["type"], "urn:ledger:problem:unavailable", "{body}");
    assert_eq!(body["outcome"], "UNKNOWN", "{body}");
    let took = service_ms(&svc, " key=k-2 ", 1).await;
    assert!(
        (BOUND_MS + GRACE_MS..BOUND_MS + GRACE_MS + SLACK_MS).contains(&took),
        "answered after {took} ms on the service's clock"
    );
    // Resumed, the stopped session takes its pending cancel: rolled back, nothing of k-2.
    holder.batch_execute("COMMIT").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !service_backends(&db)
        .await
        .iter()
        .all(|pid| !waiting.contains(pid))
    {
        assert!(
            Instant::now() < deadline,
            "the cancelled session never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        db.recorded().await,
        before,
        "the cancelled transaction rolled back"
    );
    let executed = svc.debit("acct-0001", "app-a", "k-2", "10").await;
    assert_eq!(executed.status, 201, "{}", executed.raw);
    assert!(!executed.replayed());
    assert_eq!(db.balance("acct-0001").await, 90);
}

/// A session outside the service holds the `sys-redeem` row lock: a debit waits at most
/// the lock bound, is answered 503 `UNKNOWN` with `Retry-After`, records nothing; the
/// liveness route answers at once meanwhile; after the holder commits, the same key
/// executes once, and its retry replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_wait_is_bounded_and_the_same_key_executes_once_later() {
    const LOCK_MS: u64 = 300;
    let db = TestDb::new("b_lock").await;
    let svc = Service::start(&db.url(), with_args(&["--lock-timeout-ms", "300"])).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    let before = db.recorded().await;

    let holder = db.connect().await;
    holder
        .batch_execute(
            "BEGIN; UPDATE account SET balance = balance WHERE account_id = 'sys-redeem'",
        )
        .await
        .unwrap();
    let refused = svc.debit("acct-0001", "app-a", "k-1", "10").await;
    assert_problem(&refused, 503, "UNKNOWN", "lock wait ran out");
    assert_eq!(refused.headers.get("retry-after").unwrap(), "1");
    let took = service_ms(&svc, " key=k-1 ", 1).await;
    assert!(
        (LOCK_MS..LOCK_MS + 1_000).contains(&took),
        "answered after {took} ms on the service's clock"
    );
    assert_eq!(db.recorded().await, before, "nothing recorded");
    assert_eq!(db.balance("acct-0001").await, 100);
    // Answered while the row is still held: liveness never waits on the database.
    let health = get(&svc, &svc.public, "/healthz").await;
    assert_eq!(health.status, 200);
    let ready = get(&svc, &svc.public, "/readyz").await;
    assert_eq!(
        ready.status, 200,
        "a pooled connection is free: {}",
        ready.raw
    );

    holder.batch_execute("COMMIT").await.unwrap();
    let executed = svc.debit("acct-0001", "app-a", "k-1", "10").await;
    assert_eq!(executed.status, 201, "{}", executed.raw);
    assert!(!executed.replayed(), "executed now, for the first time");
    let replayed = svc.debit("acct-0001", "app-a", "k-1", "10").await;
    assert!(replayed.replayed());
    assert_eq!(replayed.body["txn_id"], executed.body["txn_id"]);
    assert_eq!(
        db.scalar("SELECT count(*) FROM ledger_txn WHERE idem_key = 'k-1'")
            .await,
        1
    );
    assert_eq!(db.balance("acct-0001").await, 90);
    let mut client = db.connect().await;
    assert!(
        points_ledger::reconcile(&mut client)
            .await
            .unwrap()
            .is_clean()
    );
}

/// A statement that runs past the statement bound (here a trigger that sleeps) is
/// cancelled by the server (57014): 503 `UNKNOWN` with `Retry-After`, nothing recorded;
/// the same key executes once the slow trigger is gone.
#[tokio::test]
async fn statement_bound_cancels_a_slow_statement() {
    let db = TestDb::new("b_statement").await;
    let svc = Service::start(&db.url(), with_args(&["--statement-timeout-ms", "200"])).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    db.client
        .batch_execute(
            "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN PERFORM pg_sleep(2); RETURN NEW; END $$; \
             CREATE TRIGGER entry_slow BEFORE INSERT ON ledger_entry \
             FOR EACH ROW EXECUTE FUNCTION slow()",
        )
        .await
        .unwrap();
    let before = db.recorded().await;
    let cancelled = svc.debit("acct-0001", "app-a", "k-1", "10").await;
    assert_problem(&cancelled, 503, "UNKNOWN", "statement bound");
    assert_eq!(cancelled.headers.get("retry-after").unwrap(), "1");
    // The trigger sleeps 2 s; the statement bound (200 ms) ended it well before.
    let took = service_ms(&svc, " key=k-1 ", 1).await;
    assert!(
        took < 1_500,
        "answered after {took} ms on the service's clock"
    );
    assert_eq!(db.recorded().await, before, "nothing recorded");
    db.client
        .batch_execute("DROP TRIGGER entry_slow ON ledger_entry")
        .await
        .unwrap();
    let executed = svc.debit("acct-0001", "app-a", "k-1", "10").await;
    assert_eq!(executed.status, 201, "{}", executed.raw);
    assert!(!executed.replayed());
    assert_eq!(db.balance("acct-0001").await, 90);
}

/// `pause` without `hold_ms` holds until released (bounded by `MAX_FAULT_HOLD_MS`, which
/// the state reports), not 0 ms; with a short idle-in-transaction bound, the server ends
/// a session held past it, and the transfer is answered 503 `UNKNOWN` with nothing
/// recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_without_hold_ms_holds_until_released() {
    let db = TestDb::new("b_pause").await;
    let svc = Service::start(
        &db.url(),
        Options {
            faults: true,
            ..Options::default()
        },
    )
    .await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    svc.arm("entries-written", json!({"action": "pause"})).await;
    let state = svc.faults().await;
    assert_eq!(state.body["faults"][1]["hold_ms"], 60_000, "{}", state.raw);
    let request = svc.post(
        &svc.public,
        "/accounts/acct-0001/debits",
        &[("x-client-id", b"app-a"), ("idempotency-key", b"k-1"), FORM],
        "amount=10",
    );
    let http = svc.http.clone();
    let pending = tokio::spawn(async move { http.execute(request.build().unwrap()).await });
    wait_until_holding(&svc, 1, 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !pending.is_finished(),
        "a pause without hold_ms went on by itself"
    );
    assert_eq!(svc.faults().await.body["faults"][1]["holding"], 1);
    assert_eq!(db.balance("acct-0001").await, 100);
    let released = svc
        .send(
            svc.http
                .post(format!("{}/faults/entries-written/release", svc.admin)),
        )
        .await
        .unwrap();
    assert_eq!(released.body["released"], 1);
    assert_eq!(pending.await.unwrap().unwrap().status(), 201);
    assert_eq!(db.balance("acct-0001").await, 90);

    // The same pause in a service whose idle-in-transaction bound is 300 ms.
    let db = TestDb::new("b_idle").await;
    let svc = Service::start(
        &db.url(),
        Options {
            faults: true,
            extra_args: vec!["--idle-in-transaction-timeout-ms".into(), "300".into()],
            ..Options::default()
        },
    )
    .await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    let before = db.recorded().await;
    svc.arm("entries-written", json!({"action": "pause"})).await;
    let request = svc.post(
        &svc.public,
        "/accounts/acct-0001/debits",
        &[("x-client-id", b"app-a"), ("idempotency-key", b"k-1"), FORM],
        "amount=10",
    );
    let http = svc.http.clone();
    let pending = tokio::spawn(async move { http.execute(request.build().unwrap()).await });
    wait_until_holding(&svc, 1, 1).await;
    // The server ends the idle session after 300 ms and rolls its transaction back.
    let deadline = Instant::now() + Duration::from_secs(10);
    while db
        .scalar("SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND application_name = 'ledger-svc'")
        .await
        != 0
    {
        assert!(Instant::now() < deadline, "the idle session was not ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    svc.send(
        svc.http
            .post(format!("{}/faults/entries-written/release", svc.admin)),
    )
    .await
    .unwrap();
    let response = pending.await.unwrap().unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers().get("retry-after").unwrap(), "1");
    assert_eq!(db.recorded().await, before, "nothing recorded");
    let retried = svc.debit("acct-0001", "app-a", "k-1", "10").await;
    assert_eq!(retried.status, 201, "{}", retried.raw);
    assert_eq!(db.balance("acct-0001").await, 90);
}

/// Polls `GET /faults` until hook point number `index` holds `holding` transfers.
async fn wait_until_holding(svc: &Service, index: usize, holding: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = svc.faults().await;
        if state.body["faults"][index]["holding"] == holding {
            return;
        }
        assert!(Instant::now() < deadline, "never held: {}", state.raw);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// SQLSTATE 22003 is the client's error (400) only when our own balance arithmetic
/// raised it; the same code from a trigger (raised, or from the trigger's own bigint
/// arithmetic) is a server-side failure: 500 `UNKNOWN`, nothing recorded.
#[tokio::test]
async fn out_of_range_is_blamed_by_where_it_comes_from() {
    let db = TestDb::new("b_22003").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);

    // Our own arithmetic: a grant past the bigint range.
    let before = db.recorded().await;
    let own = svc.grant("acct-0002", "g-max", i64::MAX).await;
    assert_problem(&own, 400, "BAD_REQUEST", "own arithmetic");
    assert_eq!(db.recorded().await, before);

    // A trigger that raises 22003 itself.
    db.client
        .batch_execute(
            "CREATE FUNCTION raise_22003() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN RAISE EXCEPTION 'audit limit' USING ERRCODE = 'numeric_value_out_of_range'; END $$; \
             CREATE TRIGGER entry_audit BEFORE INSERT ON ledger_entry \
             FOR EACH ROW EXECUTE FUNCTION raise_22003()",
        )
        .await
        .unwrap();
    let before = db.recorded().await;
    for attempt in ["first", "same key again"] {
        let raised = svc.debit("acct-0001", "app-a", "k-1", "10").await;
        assert_problem(&raised, 500, "UNKNOWN", attempt);
    }
    assert_eq!(db.recorded().await, before, "nothing recorded");
    assert_eq!(db.balance("acct-0001").await, 100);

    // A trigger whose own bigint arithmetic overflows (the same routine as ours, but
    // inside a function: the error has a context).
    db.client
        .batch_execute(
            "DROP TRIGGER entry_audit ON ledger_entry; \
             CREATE FUNCTION overflow_22003() RETURNS trigger LANGUAGE plpgsql AS $$ \
             DECLARE big bigint := 9223372036854775807; \
             BEGIN big := big + NEW.amount; RETURN NEW; END $$; \
             CREATE TRIGGER entry_overflow BEFORE INSERT ON ledger_entry \
             FOR EACH ROW WHEN (NEW.amount > 0) EXECUTE FUNCTION overflow_22003()",
        )
        .await
        .unwrap();
    let overflowed = svc.debit("acct-0001", "app-a", "k-2", "10").await;
    assert_problem(&overflowed, 500, "UNKNOWN", "trigger arithmetic");
    assert_eq!(db.recorded().await, before, "nothing recorded");

    // Without the trigger the same key executes.
    db.client
        .batch_execute("DROP TRIGGER entry_overflow ON ledger_entry")
        .await
        .unwrap();
    let done = svc.debit("acct-0001", "app-a", "k-2", "10").await;
    assert_eq!(done.status, 201, "{}", done.raw);
}

/// Liveness and readiness apart: with the database stopped, `/healthz` still answers 200
/// at once, `/readyz` answers 503 within its bound, and a debit 503 `UNKNOWN`.
#[tokio::test]
async fn readiness_follows_the_database_liveness_does_not() {
    // Its own cluster: stopping it must not disturb the other tests' databases.
    let mut cluster = tokio::task::spawn_blocking(|| {
        scratch_pg::Cluster::start(scratch_pg::ClusterOptions::default())
    })
    .await
    .unwrap()
    .expect("start scratch PostgreSQL");
    cluster.create_database("b_ready", None).await.unwrap();
    {
        let client = cluster.connect("b_ready").await.unwrap();
        points_ledger::schema::install(&client).await.unwrap();
        points_ledger::schema::seed(&client).await.unwrap();
    }
    let svc = Service::start(&cluster.url("b_ready"), Options::default()).await;
    let ready = get(&svc, &svc.admin, "/readyz").await;
    assert_eq!(
        (ready.status, ready.body.clone()),
        (200, json!({"status": "ready"}))
    );
    let mut cluster = tokio::task::spawn_blocking(move || {
        cluster.stop(scratch_pg::StopMode::Fast).map(|()| cluster)
    })
    .await
    .unwrap()
    .expect("stop");
    for (listener, base) in [("Public", &svc.public), ("Admin", &svc.admin)] {
        // Live with the database stopped: liveness never touches it.
        let health = get(&svc, base, "/healthz").await;
        assert_eq!(
            (health.status, health.body.clone()),
            (200, json!({"status": "ok"}))
        );
        // Readiness answers within its own bound (1 s), on the service's clock.
        let needle = format!("listener={listener} method=GET route=/readyz");
        let (ready, took) = timed_get(&svc, base, "/readyz", &needle).await;
        assert_problem(&ready, 503, "UNKNOWN", "readyz without a database");
        assert_eq!(ready.headers.get("retry-after").unwrap(), "1");
        assert!(took < 3_000, "readyz took {took} ms on the service's clock");
    }
    let debit = svc.debit("acct-0001", "app-a", "k-1", "5").await;
    assert_problem(&debit, 503, "UNKNOWN", "debit without a database");
    drop(svc);
    let _ = cluster.stop(scratch_pg::StopMode::Fast);
}

/// One log line per request, with its fields; a debit that commits after its client went
/// away is logged with its real status and `client_gone=true`; `RUST_LOG` filters the
/// lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_line_per_request_also_when_the_client_went_away() {
    let db = TestDb::new("b_log").await;
    let svc = Service::start(
        &db.url(),
        Options {
            faults: true,
            ..Options::default()
        },
    )
    .await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    let first = svc.debit("acct-0001", "app-a", "k-1", "10").await;
    let txn_id = first.body["txn_id"].as_i64().unwrap();
    let lines = wait_lines(&svc, "key=k-1 ", 1).await;
    for field in [
        "listener=Public",
        "method=POST",
        "route=/accounts/{id}/debits",
        "client_id=app-a",
        "status=201",
        "outcome=OK",
        "replayed=false",
        &format!("txn_id={txn_id}"),
        "duration_ms=",
        "client_gone=false",
    ] {
        assert!(lines[0].contains(field), "no {field}: {}", lines[0]);
    }
    svc.debit("acct-0001", "app-a", "k-1", "10").await;
    assert!(wait_lines(&svc, "key=k-1 ", 2).await[1].contains("replayed=true"));

    // The client gives up after 100 ms; the service commits, then holds 500 ms.
    svc.arm(
        "after-commit",
        json!({"action": "delay", "hold_ms": 500, "count": 1}),
    )
    .await;
    let gone = svc
        .send(
            svc.post(
                &svc.public,
                "/accounts/acct-0001/debits",
                &[("x-client-id", b"app-a"), ("idempotency-key", b"k-2"), FORM],
                "amount=10",
            )
            .timeout(Duration::from_millis(100)),
        )
        .await;
    assert!(gone.is_err_and(|e| e.is_timeout()));
    let line = wait_lines(&svc, "key=k-2 ", 1).await.remove(0);
    assert!(line.contains("status=201"), "{line}");
    assert!(line.contains("client_gone=true"), "{line}");
    assert_eq!(db.balance("acct-0001").await, 80);

    // RUST_LOG switches the request lines off.
    let quiet = Service::start(
        &db.url(),
        Options {
            env: vec![("RUST_LOG".into(), "ledger_svc::request=off".into())],
            ..Options::default()
        },
    )
    .await;
    assert_eq!(
        quiet.debit("acct-0001", "app-a", "k-3", "10").await.status,
        201
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(quiet.log_lines("route=").is_empty());
    assert!(!quiet.log_lines("ledger-svc: database=").is_empty());
}

/// Waits until `count` log lines contain `needle` (the line of a transfer is written by
/// its task right after the response is handed over), and returns them.
async fn wait_lines(svc: &Service, needle: &str, count: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines = svc.log_lines(needle);
        if lines.len() >= count {
            assert_eq!(lines.len(), count, "{lines:?}");
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "log lines with {needle}: {lines:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Key retention: after the window a sweep leaves a tombstone; the same key answers 422
/// `KEY_EXPIRED` naming the original transaction and executes nothing; another payload
/// under it is still `KEY_REUSED`; an expired refusal names no transaction; reconciliation
/// stays clean. A record removed by hand gets the same 422 instead of 503 forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_and_removed_keys_answer_422_key_expired() {
    let db = TestDb::new("b_expired").await;
    let svc = Service::start(
        &db.url(),
        with_args(&["--key-retention-ms", "300", "--key-sweep-interval-ms", "50"]),
    )
    .await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    let first = svc.debit("acct-0001", "app-a", "k-1", "30").await;
    assert_eq!(first.status, 201);
    let refused = svc.debit("acct-0001", "app-a", "k-2", "1000").await;
    assert_eq!(refused.status, 409);
    let transfer = || {
        svc.send(svc.post(
            &svc.admin,
            "/transfers",
            &[
                ("x-client-id", b"ops"),
                ("idempotency-key", b"t-1"),
                ("content-type", b"application/json"),
            ],
            json!({"from": "acct-0001", "to": "acct-0002", "amount": 5}).to_string(),
        ))
    };
    let moved = transfer().await.unwrap();
    assert_eq!(moved.status, 201, "{}", moved.raw);
    let deadline = Instant::now() + Duration::from_secs(10);
    while db
        .scalar("SELECT count(*) FROM idem_request WHERE outcome <> 'EXPIRED'")
        .await
        != 0
    {
        assert!(Instant::now() < deadline, "the sweep never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tombstone = db
        .client
        .query_one(
            "SELECT request_hash, txn_id, balance_after, expired_at > created_at \
             FROM idem_request WHERE idem_key = 'k-1'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(tombstone.get::<_, String>(0).len(), 32, "fingerprint kept");
    assert_eq!(
        tombstone.get::<_, Option<i64>>(1),
        first.body["txn_id"].as_i64()
    );
    assert_eq!(tombstone.get::<_, Option<i64>>(2), None, "response dropped");
    assert!(tombstone.get::<_, bool>(3));

    let before = db.recorded().await;
    let expired = svc.debit("acct-0001", "app-a", "k-1", "30").await;
    assert_problem(&expired, 422, "KEY_EXPIRED", "expired key");
    assert_eq!(expired.body["txn_id"], first.body["txn_id"]);
    let other = svc.debit("acct-0001", "app-a", "k-1", "31").await;
    assert_problem(&other, 422, "KEY_REUSED", "expired key, other payload");
    let expired_refusal = svc.debit("acct-0001", "app-a", "k-2", "1000").await;
    assert_problem(&expired_refusal, 422, "KEY_EXPIRED", "expired refusal");
    assert_eq!(expired_refusal.body["txn_id"], serde_json::Value::Null);
    // A transfer's expired key is the same 422, naming its transaction (not a 500).
    let expired_transfer = transfer().await.unwrap();
    assert_problem(
        &expired_transfer,
        422,
        "KEY_EXPIRED",
        "expired transfer key",
    );
    assert_eq!(expired_transfer.body["txn_id"], moved.body["txn_id"]);
    assert_eq!(db.recorded().await, before, "nothing recorded");
    assert_eq!(db.balance("acct-0001").await, 65);
    let mut client = db.connect().await;
    let findings = points_ledger::reconcile(&mut client).await.unwrap();
    assert!(findings.is_clean(), "{}", findings.summary());

    // Retention off: a record removed by hand.
    let db = TestDb::new("b_removed").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    let first = svc.debit("acct-0001", "app-a", "k-1", "30").await;
    db.client
        .batch_execute("DELETE FROM idem_request WHERE idem_key = 'k-1'")
        .await
        .unwrap();
    for attempt in ["first", "again"] {
        let removed = svc.debit("acct-0001", "app-a", "k-1", "30").await;
        assert_problem(&removed, 422, "KEY_EXPIRED", attempt);
        assert_eq!(removed.body["txn_id"], first.body["txn_id"]);
    }
    assert_eq!(db.balance("acct-0001").await, 70);
    // Reconciliation reports the hand-made hole: a transaction without its record.
    let mut client = db.connect().await;
    let findings = points_ledger::reconcile(&mut client).await.unwrap();
    assert_eq!(findings.txns_without_request.len(), 1);
}
