//! The HTTP contract of `ledger-svc` (SPEC §4), against the real binary and a real
//! PostgreSQL 16 (scratch cluster): every row of the status table, every class of
//! malformed request (with nothing recorded and no balance changed), the routes, the
//! fault routes with and without `--enable-fault-injection`, graceful shutdown, and the
//! pool's recovery after an immediate restart of the server.

mod common;

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::TestDb;
use common::service::{Options, Reply, Service};

/// A request header: name and raw value.
type Header<'a> = (&'a str, &'a [u8]);

const FORM: (&str, &[u8]) = ("content-type", b"application/x-www-form-urlencoded");
const JSON: (&str, &[u8]) = ("content-type", b"application/json");

fn assert_problem(reply: &Reply, status: u16, outcome: &str, what: &str) {
    assert_eq!(reply.status, status, "{what}: {}", reply.raw);
    assert_eq!(
        reply.content_type(),
        "application/problem+json",
        "{what}: {}",
        reply.raw
    );
    assert_eq!(reply.outcome(), outcome, "{what}: {}", reply.raw);
    assert_eq!(reply.body["status"], status, "{what}");
    for member in ["type", "title", "detail"] {
        assert!(reply.body[member].is_string(), "{what}: no {member}");
    }
    assert!(!reply.replayed(), "{what}: marked replayed");
    let text = reply.raw.to_lowercase();
    for driver_text in ["sqlstate", "db error", "postgres", "tokio"] {
        assert!(!text.contains(driver_text), "{what}: driver text: {text}");
    }
}

/// Every row of the SPEC §4 table, first time and replayed.
#[tokio::test]
async fn status_table_rows_and_replays() {
    let db = TestDb::new("h_table").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    let granted = svc.grant("acct-0001", "g-1", 100).await;
    assert_eq!(granted.status, 201, "{}", granted.raw);
    assert_eq!(granted.body["balance"], 100);

    // 201 OK, then its replay: same status and body, plus Idempotent-Replayed: true.
    let first = svc.debit("acct-0001", "app-a", "k-1", "30").await;
    assert_eq!(first.status, 201, "{}", first.raw);
    assert_eq!(first.content_type(), "application/json");
    assert_eq!(first.outcome(), "OK");
    assert_eq!(first.body["balance"], 70);
    assert!(first.body["txn_id"].is_i64());
    assert!(!first.replayed());
    let again = svc.debit("acct-0001", "app-a", "k-1", "30").await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.raw, first.raw);

    // 409 INSUFFICIENT, recorded and replayed.
    let refused = svc.debit("acct-0001", "app-a", "k-2", "1000").await;
    assert_problem(&refused, 409, "INSUFFICIENT", "insufficient");
    assert_eq!(refused.body["balance"], 70);
    let refused_again = svc.debit("acct-0001", "app-a", "k-2", "1000").await;
    assert_eq!(refused_again.status, 409);
    assert!(refused_again.replayed());
    assert_eq!(refused_again.raw, refused.raw);

    // 404 NO_ACCOUNT, recorded and replayed.
    let missing = svc.debit("acct-9999", "app-a", "k-3", "5").await;
    assert_problem(&missing, 404, "NO_ACCOUNT", "no account");
    let missing_again = svc.debit("acct-9999", "app-a", "k-3", "5").await;
    assert_eq!(missing_again.status, 404);
    assert!(missing_again.replayed());
    assert_eq!(missing_again.raw, missing.raw);

    // 422 KEY_REUSED: same key, other payload (amount, or account); nothing recorded.
    let before = db.recorded().await;
    let reused = svc.debit("acct-0001", "app-a", "k-1", "31").await;
    assert_problem(&reused, 422, "KEY_REUSED", "other amount");
    let reused_account = svc.debit("acct-0002", "app-a", "k-1", "30").await;
    assert_problem(&reused_account, 422, "KEY_REUSED", "other account");
    assert_eq!(db.recorded().await, before);
    assert_eq!(db.balance("acct-0001").await, 70);

    // The same request in JSON, and with the key in RFC 8941 quoted form: one key.
    let as_json = svc
        .send(svc.post(
            &svc.public,
            "/accounts/acct-0001/debits",
            &[
                ("x-client-id", b"app-a"),
                ("idempotency-key", b"\"k-1\""),
                JSON,
            ],
            r#"{"amount": 30}"#,
        ))
        .await
        .unwrap();
    assert_eq!(as_json.status, 201);
    assert!(as_json.replayed());
    assert_eq!(as_json.raw, first.raw);

    // The key is scoped by client id: another client, same key string → fresh.
    let other_client = svc.debit("acct-0001", "app-b", "k-1", "30").await;
    assert_eq!(other_client.status, 201);
    assert!(!other_client.replayed());
    assert_eq!(other_client.body["balance"], 40);
    assert_ne!(other_client.body["txn_id"], first.body["txn_id"]);

    // Balance read.
    let balance = svc
        .send(svc.http.get(format!("{}/accounts/acct-0001", svc.public)))
        .await
        .unwrap();
    assert_eq!(balance.status, 200);
    assert_eq!(
        balance.body,
        json!({"account_id": "acct-0001", "balance": 40})
    );
    let no_balance = svc
        .send(svc.http.get(format!("{}/accounts/acct-9999", svc.public)))
        .await
        .unwrap();
    assert_problem(
        &no_balance,
        404,
        "NO_ACCOUNT",
        "balance of a missing account",
    );

    // Grants: 201 and replay on the admin listener; a grant to a missing account is 404
    // and not recorded (the transfer rolled back).
    let regrant = svc.grant("acct-0001", "g-1", 100).await;
    assert_eq!(regrant.status, 201);
    assert!(regrant.replayed());
    let before = db.recorded().await;
    let grant_missing = svc.grant("acct-9999", "g-2", 5).await;
    assert_problem(
        &grant_missing,
        404,
        "NO_ACCOUNT",
        "grant to a missing account",
    );
    assert_eq!(db.recorded().await, before);
    let mut client = db.connect().await;
    assert!(
        points_ledger::reconcile(&mut client)
            .await
            .unwrap()
            .is_clean()
    );
}

/// A request of each malformed class gets its 4xx problem (outcome BAD_REQUEST), and
/// none registers the key or moves a point: afterwards the same key runs fresh.
/// A debit's business reference (`order_id`): stored on its transaction, part of the
/// fingerprint (the same key with another order, or without one, is 422), replayed
/// unchanged; a debit without one stores NULL; a grant naming one is 400.
#[tokio::test]
async fn order_id_is_part_of_the_debit() {
    let db = TestDb::new("h_order").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);

    let first = svc
        .debit("acct-0001", "app-o", "k-1", "30&order_id=ord-1")
        .await;
    assert_eq!(first.status, 201, "{}", first.raw);
    let again = svc
        .debit("acct-0001", "app-o", "k-1", "30&order_id=ord-1")
        .await;
    assert!(again.replayed());
    assert_eq!(again.raw, first.raw);
    for other in ["30&order_id=ord-2", "30"] {
        let reused = svc.debit("acct-0001", "app-o", "k-1", other).await;
        assert_problem(&reused, 422, "KEY_REUSED", other);
    }
    // Without an order: the key of a plain debit refuses the same debit with an order.
    assert_eq!(
        svc.debit("acct-0001", "app-o", "k-2", "5").await.status,
        201
    );
    let reused = svc
        .debit("acct-0001", "app-o", "k-2", "5&order_id=ord-1")
        .await;
    assert_problem(&reused, 422, "KEY_REUSED", "order added on retry");

    assert_eq!(
        db.scalar("SELECT count(*) FROM ledger_txn WHERE idem_key = 'k-1' AND order_id = 'ord-1'")
            .await,
        1
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM ledger_txn WHERE idem_key = 'k-2' AND order_id IS NULL")
            .await,
        1
    );
    assert_eq!(db.balance("acct-0001").await, 65);

    let before = db.recorded().await;
    let grant = svc
        .send(svc.post(
            &svc.admin,
            "/accounts/acct-0001/grants",
            &[("x-client-id", b"ops"), ("idempotency-key", b"g-2"), JSON],
            r#"{"amount": 5, "order_id": "ord-3"}"#,
        ))
        .await
        .expect("grant request");
    assert_problem(&grant, 400, "BAD_REQUEST", "grant with an order");
    assert_eq!(db.recorded().await, before);
}

#[tokio::test]
async fn malformed_requests_change_nothing() {
    let db = TestDb::new("h_malformed").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    let before = db.recorded().await;
    let path = "/accounts/acct-0001/debits";
    let client: (&str, &[u8]) = ("x-client-id", b"app-m");
    let key: (&str, &[u8]) = ("idempotency-key", b"k-m");
    let long_key = "k".repeat(256);
    let long_quoted_key = format!("\"{}\"", "k".repeat(256));
    let long_client = "c".repeat(65);

    // (what, path, headers, body, expected status)
    type Attempt<'a> = (&'a str, &'a str, Vec<Header<'a>>, Vec<u8>, u16);
    let mut attempts: Vec<Attempt> = Vec::new();
    for amount in [
        "0",
        "-5",
        "%2B5",
        "+5",
        "007",
        "%207",
        "1e3",
        "5.0",
        "0x10",
        "",
        "9223372036854775808",
        "five",
    ] {
        attempts.push((
            "form amount",
            path,
            vec![client, key, FORM],
            format!("amount={amount}").into_bytes(),
            400,
        ));
    }
    for body in [
        r#"{"amount": 0}"#,
        r#"{"amount": -5}"#,
        r#"{"amount": 5.0}"#,
        r#"{"amount": 1e3}"#,
        r#"{"amount": "5"}"#,
        r#"{"amount": null}"#,
        r#"{"amount": 9223372036854775808}"#,
        r#"{"amount": 007}"#,
        r#"{"amount": 5, "note": "x"}"#,
        r#"{"amount": 5, "amount": 5}"#,
        r#"{"amount": 5, "order_id": ""}"#,
        r#"{"amount": 5, "order_id": null}"#,
        r#"{"amount": 5, "order_id": 7}"#,
        r#"{"amount": 5, "order_id": "ord 1"}"#,
        r#"{"order_id": "ord-1"}"#,
        r#"{}"#,
        r#"[5]"#,
        r#"{"amount": 5"#,
        "",
    ] {
        attempts.push((
            "json body",
            path,
            vec![client, key, JSON],
            body.as_bytes().to_vec(),
            400,
        ));
    }
    for body in [
        b"amount".as_slice(),
        b"amount=5&amount=5",
        b"amount=5&note=x",
        b"amount=5&order_id=",
        b"amount=5&order_id=a&order_id=b",
        b"amount=5&order_id=ord%2F1",
        b"order_id=ord-1",
        b"amount=%zz",
        b"amount=\xff",
    ] {
        attempts.push((
            "form body",
            path,
            vec![client, key, FORM],
            body.to_vec(),
            400,
        ));
    }
    let headers_cases: Vec<(&str, Vec<Header>)> = vec![
        ("no client id", vec![key, FORM]),
        ("no key", vec![client, FORM]),
        (
            "empty quoted key",
            vec![client, ("idempotency-key", b"\"\""), FORM],
        ),
        (
            "key of 256 characters",
            vec![client, ("idempotency-key", long_key.as_bytes()), FORM],
        ),
        (
            "quoted key of 256 characters",
            vec![
                client,
                ("idempotency-key", long_quoted_key.as_bytes()),
                FORM,
            ],
        ),
        (
            "non-ASCII key",
            vec![client, ("idempotency-key", "k-\u{e9}".as_bytes()), FORM],
        ),
        (
            "key with a blank, unquoted",
            vec![client, ("idempotency-key", b"k m"), FORM],
        ),
        (
            "unterminated quoted key",
            vec![client, ("idempotency-key", b"\"k-m"), FORM],
        ),
        (
            "quoted key with a parameter",
            vec![client, ("idempotency-key", b"\"k-m\";x=1"), FORM],
        ),
        (
            "two keys",
            vec![
                client,
                ("idempotency-key", b"k-m"),
                ("idempotency-key", b"k-n"),
                FORM,
            ],
        ),
        ("empty client id", vec![("x-client-id", b""), key, FORM]),
        (
            "client id of 65 characters",
            vec![("x-client-id", long_client.as_bytes()), key, FORM],
        ),
        (
            "client id with a blank",
            vec![("x-client-id", b"app m"), key, FORM],
        ),
        (
            "two client ids",
            vec![client, ("x-client-id", b"app-n"), key, FORM],
        ),
    ];
    for (what, headers) in headers_cases {
        attempts.push((what, path, headers, b"amount=5".to_vec(), 400));
    }
    attempts.push((
        "no content type",
        path,
        vec![client, key],
        b"amount=5".to_vec(),
        415,
    ));
    attempts.push((
        "text/plain",
        path,
        vec![client, key, ("content-type", b"text/plain")],
        b"amount=5".to_vec(),
        415,
    ));
    attempts.push((
        "body over 4 KiB",
        path,
        vec![client, key, FORM],
        format!("amount=5&pad={}", "x".repeat(5000)).into_bytes(),
        413,
    ));
    attempts.push((
        "percent-encoded account id",
        "/accounts/acct%2D0001/debits",
        vec![client, key, FORM],
        b"amount=5".to_vec(),
        400,
    ));
    attempts.push((
        "system account",
        "/accounts/sys-issuer/debits",
        vec![client, key, FORM],
        b"amount=5".to_vec(),
        403,
    ));

    for (what, path, headers, body, status) in attempts {
        let reply = svc
            .send(svc.post(&svc.public, path, &headers, body.clone()))
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let shown = String::from_utf8_lossy(&body)
            .chars()
            .take(40)
            .collect::<String>();
        // The list of inputs and answers, shown with --nocapture.
        println!(
            "{what:<30} {shown:<42} -> {} {}",
            reply.status,
            reply.outcome()
        );
        assert_problem(&reply, status, "BAD_REQUEST", &format!("{what} {shown:?}"));
        assert_eq!(
            db.recorded().await,
            before,
            "{what}: something was recorded"
        );
        assert_eq!(db.balance("acct-0001").await, 100, "{what}: balance moved");
    }

    // A chunked body over the limit (no Content-Length to check up front).
    let raw = raw_request(
        &svc.public,
        &format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nx-client-id: app-m\r\nidempotency-key: k-m\r\n\
             content-type: application/x-www-form-urlencoded\r\ntransfer-encoding: chunked\r\n\
             connection: close\r\n\r\n1388\r\namount=5&{}\r\n0\r\n\r\n",
            "x".repeat(5000 - 9)
        ),
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert!(raw.contains("\"outcome\":\"BAD_REQUEST\""), "{raw}");
    assert_eq!(db.recorded().await, before);

    // Nothing above registered the key: it now runs fresh.
    let fresh = svc.debit("acct-0001", "app-m", "k-m", "5").await;
    assert_eq!(fresh.status, 201, "{}", fresh.raw);
    assert!(!fresh.replayed());
    assert_eq!(fresh.body["balance"], 95);
}

/// Writes `request` on a new connection to `base` and reads until the server closes.
async fn raw_request(base: &str, request: &str) -> String {
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response)).await;
    String::from_utf8_lossy(&response).into_owned()
}

/// Unknown routes are 404 problems, wrong methods 405 with Allow; grants and fault routes
/// do not exist on the public listener, and fault routes not without the enable flag.
#[tokio::test]
async fn routes_methods_and_listeners() {
    let db = TestDb::new("h_routes").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    let get = |base: &str, path: &str| svc.http.get(format!("{base}{path}"));

    let health = svc.send(get(&svc.public, "/healthz")).await.unwrap();
    assert_eq!(
        (health.status, health.body.clone()),
        (200, json!({"status": "ok"}))
    );
    let health = svc.send(get(&svc.admin, "/healthz")).await.unwrap();
    assert_eq!(health.status, 200);

    for (base, path) in [
        (&svc.public, "/"),
        (&svc.public, "/nope"),
        (&svc.public, "/accounts"),
        (&svc.public, "/accounts/acct-0001/"),
        (&svc.public, "/accounts/acct-0001/debits/x"),
        (&svc.admin, "/accounts/acct-0001"),
        (&svc.admin, "/accounts/acct-0001/debits"),
    ] {
        let reply = svc.send(get(base, path)).await.unwrap();
        assert_problem(&reply, 404, "BAD_REQUEST", path);
    }

    let wrong = svc
        .send(get(&svc.public, "/accounts/acct-0001/debits"))
        .await
        .unwrap();
    assert_problem(&wrong, 405, "BAD_REQUEST", "GET debits");
    assert_eq!(wrong.headers.get("allow").unwrap(), "POST");
    let wrong = svc
        .send(
            svc.http
                .delete(format!("{}/accounts/acct-0001", svc.public)),
        )
        .await
        .unwrap();
    assert_problem(&wrong, 405, "BAD_REQUEST", "DELETE account");
    assert_eq!(wrong.headers.get("allow").unwrap(), "GET");
    let wrong = svc
        .send(svc.http.post(format!("{}/healthz", svc.public)))
        .await
        .unwrap();
    assert_problem(&wrong, 405, "BAD_REQUEST", "POST healthz");

    // Grants are not served on the public listener.
    let before = db.recorded().await;
    let public_grant = svc
        .send(svc.post(
            &svc.public,
            "/accounts/acct-0001/grants",
            &[("x-client-id", b"ops"), ("idempotency-key", b"g-1"), JSON],
            r#"{"amount": 1000}"#,
        ))
        .await
        .unwrap();
    assert_problem(
        &public_grant,
        404,
        "BAD_REQUEST",
        "grant on the public listener",
    );
    assert_eq!(db.recorded().await, before);
    assert_eq!(db.balance("acct-0001").await, 0);

    // Without --enable-fault-injection the fault routes do not exist, on either listener.
    for base in [&svc.admin, &svc.public] {
        let listing = svc.send(get(base, "/faults")).await.unwrap();
        assert_problem(&listing, 404, "BAD_REQUEST", "GET /faults");
        let arm = svc
            .send(
                svc.http
                    .put(format!("{base}/faults/after-commit"))
                    .header("content-type", "application/json")
                    .body(r#"{"action": "close", "hold_ms": 1500}"#),
            )
            .await
            .unwrap();
        assert_problem(&arm, 404, "BAD_REQUEST", "PUT /faults/after-commit");
        let clear = svc
            .send(svc.http.delete(format!("{base}/faults")))
            .await
            .unwrap();
        assert_problem(&clear, 404, "BAD_REQUEST", "DELETE /faults");
        let release = svc
            .send(svc.http.post(format!("{base}/faults/registered/release")))
            .await
            .unwrap();
        assert_problem(&release, 404, "BAD_REQUEST", "POST release");
    }
    // And a debit runs without any fault.
    assert_eq!(svc.grant("acct-0001", "g-2", 10).await.status, 201);
    assert_eq!(
        svc.debit("acct-0001", "app-a", "k-1", "3").await.status,
        201
    );
}

/// The fault routes with the flag on: validation, an after-commit `close` (committed, the
/// connection closes without a response, a retry replays), a before-commit `close`
/// (rolled back, a retry runs fresh), counted faults, and clearing.
#[tokio::test]
async fn fault_injection() {
    let db = TestDb::new("h_faults").await;
    let svc = Service::start(
        &db.url(),
        Options {
            faults: true,
            ..Options::default()
        },
    )
    .await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);

    let listing = svc.faults().await;
    assert_eq!(listing.status, 200);
    // The ledger's four points, then the spot events' four (`spot-registered`, ...).
    assert_eq!(listing.body["faults"].as_array().unwrap().len(), 8);
    assert!(
        listing.body["faults"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["remaining"] == 0 && f["action"].is_null())
    );

    for (point, body, status) in [
        ("after-commit", r#"{"action": "explode"}"#, 400),
        (
            "after-commit",
            r#"{"action": "close", "hold_ms": 60001}"#,
            400,
        ),
        ("after-commit", r#"{"action": "close", "count": 0}"#, 400),
        ("after-commit", r#"{"action": "close", "extra": 1}"#, 400),
        ("after-commit", "not json", 400),
        ("after_commit", r#"{"action": "close"}"#, 404),
    ] {
        let reply = svc
            .send(
                svc.http
                    .put(format!("{}/faults/{point}", svc.admin))
                    .header("content-type", "application/json")
                    .body(body),
            )
            .await
            .unwrap();
        assert_problem(&reply, status, "BAD_REQUEST", body);
    }

    // after-commit close: the debit commits, the client gets no response at all.
    svc.arm(
        "after-commit",
        json!({"action": "close", "hold_ms": 300, "count": 1}),
    )
    .await;
    let started = Instant::now();
    let lost = svc
        .send(svc.post(
            &svc.public,
            "/accounts/acct-0001/debits",
            &[("x-client-id", b"app-a"), ("idempotency-key", b"k-1"), FORM],
            "amount=30",
        ))
        .await;
    let error = lost.expect_err("a response arrived despite the fault");
    assert!(!error.is_timeout(), "{error:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(db.balance("acct-0001").await, 70);
    let retry = svc.debit("acct-0001", "app-a", "k-1", "30").await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    assert_eq!(retry.body["balance"], 70);
    let stored_txn: i64 = db
        .scalar("SELECT txn_id FROM idem_request WHERE client_id = 'app-a' AND idem_key = 'k-1'")
        .await;
    assert_eq!(retry.body["txn_id"], stored_txn);
    let state = svc.faults().await;
    let after_commit = &state.body["faults"][3];
    assert_eq!(after_commit["point"], "after-commit");
    assert_eq!(
        (
            after_commit["fired"].clone(),
            after_commit["remaining"].clone()
        ),
        (json!(1), json!(0))
    );

    // before-commit close, counted twice: both attempts roll back; the third runs.
    svc.arm(
        "before-commit",
        json!({"action": "close", "hold_ms": 0, "count": 2}),
    )
    .await;
    for _ in 0..2 {
        let lost = svc
            .send(svc.post(
                &svc.public,
                "/accounts/acct-0001/debits",
                &[("x-client-id", b"app-a"), ("idempotency-key", b"k-2"), FORM],
                "amount=5",
            ))
            .await;
        assert!(lost.is_err());
        assert_eq!(
            db.scalar("SELECT count(*) FROM idem_request WHERE idem_key = 'k-2'")
                .await,
            0
        );
        assert_eq!(db.balance("acct-0001").await, 70);
    }
    let third = svc.debit("acct-0001", "app-a", "k-2", "5").await;
    assert_eq!(third.status, 201);
    assert!(!third.replayed());
    assert_eq!(third.body["balance"], 65);

    // Armed, then cleared: nothing fires.
    svc.arm("registered", json!({"action": "close"})).await;
    let cleared = svc
        .send(svc.http.delete(format!("{}/faults", svc.admin)))
        .await
        .unwrap();
    assert_eq!(cleared.status, 200);
    let after_clear = svc.debit("acct-0001", "app-a", "k-3", "5").await;
    assert_eq!(after_clear.status, 201);
    let mut client = db.connect().await;
    assert!(
        points_ledger::reconcile(&mut client)
            .await
            .unwrap()
            .is_clean()
    );
}

/// `pause` holds a transfer at its hook point until released from the admin listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_release() {
    let db = TestDb::new("h_pause").await;
    let svc = Service::start(
        &db.url(),
        Options {
            faults: true,
            ..Options::default()
        },
    )
    .await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    svc.arm(
        "entries-written",
        json!({"action": "pause", "hold_ms": 30000}),
    )
    .await;
    let request = svc.post(
        &svc.public,
        "/accounts/acct-0001/debits",
        &[("x-client-id", b"app-a"), ("idempotency-key", b"k-1"), FORM],
        "amount=10",
    );
    let http = svc.http.clone();
    let pending = tokio::spawn(async move { http.execute(request.build().unwrap()).await });
    wait_until_holding(&svc, 1, 1).await;
    // Paused inside the transaction: not committed yet.
    assert_eq!(db.balance("acct-0001").await, 100);
    let released = svc
        .send(
            svc.http
                .post(format!("{}/faults/entries-written/release", svc.admin)),
        )
        .await
        .unwrap();
    assert_eq!(released.body["released"], 1);
    let response = pending.await.unwrap().unwrap();
    assert_eq!(response.status(), 201);
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

/// SIGTERM: an idle service exits 0 at once; one holding a paused transfer exits after its
/// grace period (status 1), and the paused transaction is rolled back by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shutdown_is_graceful_and_bounded() {
    let db = TestDb::new("h_shutdown").await;
    let mut idle = Service::start(&db.url(), Options::default()).await;
    // Exit 0: everything drained within the grace period, by the service's own clock (it
    // exits 1 when the grace runs out); how long the client saw it take is not a claim.
    let (status, _took) = idle.terminate().await;
    assert_eq!(status.code(), Some(0), "{status:?}");

    let mut busy = Service::start(
        &db.url(),
        Options {
            faults: true,
            shutdown_grace_ms: Some(500),
            ..Options::default()
        },
    )
    .await;
    assert_eq!(busy.grant("acct-0001", "g-1", 100).await.status, 201);
    busy.arm("registered", json!({"action": "pause", "hold_ms": 60000}))
        .await;
    let request = busy.post(
        &busy.public,
        "/accounts/acct-0001/debits",
        &[("x-client-id", b"app-a"), ("idempotency-key", b"k-1"), FORM],
        "amount=10",
    );
    let http = busy.http.clone();
    let pending = tokio::spawn(async move { http.execute(request.build().unwrap()).await });
    wait_until_holding(&busy, 0, 1).await;
    let (status, took) = busy.terminate().await;
    // Exit 1: the grace period ran out (the service's verdict); it cannot have come
    // sooner than the grace.
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert!(took >= Duration::from_millis(500), "{took:?}");
    assert!(
        pending.await.unwrap().is_err(),
        "the held request got a response"
    );
    // The server rolls the abandoned transaction back once its connection is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while db
        .scalar("SELECT count(*) FROM idem_request WHERE idem_key = 'k-1'")
        .await
        != 0
    {
        assert!(
            Instant::now() < deadline,
            "the paused registration was kept"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(db.balance("acct-0001").await, 100);
}

/// After an immediate restart of PostgreSQL the pooled connections are dead; the next
/// requests get fresh ones instead of errors. (Here the driver notices the closed sockets
/// at once, so `Fast` recycling would pass too; `Verified` also catches a connection that
/// died without the driver noticing yet.)
#[tokio::test]
async fn pool_replaces_dead_connections_after_restart() {
    common::service::restart_then_debit("h_restart", Options::default()).await;
}

/// The same with `--worker-threads 1` (a current-thread runtime, as the bench runs the
/// service): concurrent debits fill the pool, and after the restart every debit succeeds
/// once.
#[tokio::test]
async fn single_threaded_runtime_replaces_dead_connections_after_restart() {
    common::service::restart_then_debit(
        "h_restart_one_thread",
        Options {
            extra_args: vec!["--worker-threads".into(), "1".into()],
            ..Options::default()
        },
    )
    .await;
}

/// Without a usable database every route that needs one answers 503 with outcome
/// `UNKNOWN`, and no driver text (such as the server's "database ... does not exist")
/// reaches the client; requests that need no database still get their 4xx.
#[tokio::test]
async fn database_unavailable_is_503_unknown_without_driver_text() {
    let db = TestDb::new("h_unavailable").await;
    let url = db.cluster.url("h_no_such_database");
    let svc = Service::start(
        &url,
        Options {
            no_health_wait: true,
            ..Options::default()
        },
    )
    .await;
    // Liveness does not depend on the database; readiness does.
    let health = svc
        .send(svc.http.get(format!("{}/healthz", svc.public)))
        .await
        .unwrap();
    assert_eq!(health.status, 200, "{}", health.raw);
    let ready = svc
        .send(svc.http.get(format!("{}/readyz", svc.public)))
        .await
        .unwrap();
    assert_problem(&ready, 503, "UNKNOWN", "readyz");
    assert_eq!(ready.headers.get("retry-after").unwrap(), "1");
    let balance = svc
        .send(svc.http.get(format!("{}/accounts/acct-0001", svc.public)))
        .await
        .unwrap();
    assert_problem(&balance, 503, "UNKNOWN", "balance");
    let debit = svc.debit("acct-0001", "app-a", "k-1", "5").await;
    assert_problem(&debit, 503, "UNKNOWN", "debit");
    assert!(!debit.raw.contains("h_no_such_database"), "{}", debit.raw);
    let grant = svc.grant("acct-0001", "g-1", 5).await;
    assert_problem(&grant, 503, "UNKNOWN", "grant");
    let malformed = svc.debit("acct-0001", "app-a", "k-1", "007").await;
    assert_problem(
        &malformed,
        400,
        "BAD_REQUEST",
        "malformed without a database",
    );
}

/// A grant that would take a balance past the bigint range (SQLSTATE 22003 in the
/// database) is the client's error: 400 BAD_REQUEST, nothing recorded, and a retry with
/// the same key is refused the same way instead of a 5xx that invites retrying.
#[tokio::test]
async fn grant_beyond_the_range_of_points_is_400_not_5xx() {
    let db = TestDb::new("h_overflow").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 1000).await.status, 201);
    let before = db.recorded().await;
    for attempt in ["first", "retry with the same key"] {
        let reply = svc.grant("acct-0002", "g-max", i64::MAX).await;
        assert_problem(&reply, 400, "BAD_REQUEST", attempt);
    }
    assert_eq!(db.recorded().await, before, "nothing recorded");
    assert_eq!(
        db.scalar("SELECT balance FROM account WHERE account_id = 'acct-0002'")
            .await,
        0
    );
}

/// A body that never finishes arriving is answered 408 with a problem body after
/// `BODY_READ_TIMEOUT_MS`, the connection does not stay open forever, and nothing is
/// recorded.
#[tokio::test]
async fn slow_body_is_408_and_records_nothing() {
    let db = TestDb::new("h_slow_body").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    let before = db.recorded().await;
    // Content-Length promises 100 bytes; 8 arrive, and the connection stays open.
    let raw = raw_request(
        &svc.public,
        "POST /accounts/acct-0001/debits HTTP/1.1\r\nhost: x\r\nx-client-id: app-s\r\n\
         idempotency-key: k-slow\r\ncontent-type: application/x-www-form-urlencoded\r\n\
         content-length: 100\r\n\r\namount=5",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 408"), "got: {raw}");
    assert!(
        raw.contains("application/problem+json") && raw.contains("BAD_REQUEST"),
        "{raw}"
    );
    // The body bound (5 s), on the service's clock: it answered at that bound, not later.
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let lines = svc.log_lines("route=/accounts/{id}/debits");
        if let Some(line) = lines.into_iter().find(|line| line.contains("status=408")) {
            break line;
        }
        assert!(Instant::now() < deadline, "no request line for the 408");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took: u64 = line
        .split_whitespace()
        .find_map(|field| field.strip_prefix("duration_ms="))
        .and_then(|ms| ms.parse().ok())
        .expect("duration_ms");
    assert!(
        (5_000..9_000).contains(&took),
        "answered after {took} ms: {line}"
    );
    assert_eq!(db.recorded().await, before, "nothing recorded");
}
