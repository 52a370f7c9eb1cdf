//! `--auth-tokens FILE` (`ledger-svc`'s `http::auth`), against the real binary and a real
//! PostgreSQL 16: 401 with `WWW-Authenticate` for a missing, unknown or other-scheme
//! token, recording nothing; 403 for another client's `X-Client-Id`, recording nothing;
//! the token's caller scoping the keys; the admin listener and the fault routes only for
//! an admin token (the spot routes and their tenant rule: `spot_contract.rs`); the probes
//! open; a bad token file refusing the start; and neither the
//! token file nor the service's log holding a token.

mod common;

use std::process::Command;

use serde_json::json;

use common::TestDb;
use common::service::{Options, Reply, Service};
use common::tokens::{CALLERS, TOKEN_A, TOKEN_B, TOKEN_OPS, UNKNOWN_TOKEN, sha256_hex, token_file};

const FORM: (&str, &[u8]) = ("content-type", b"application/x-www-form-urlencoded");
const JSON: (&str, &[u8]) = ("content-type", b"application/json");

async fn start(db: &TestDb, tokens: &std::path::Path, faults: bool) -> Service {
    Service::start(
        &db.url(),
        Options {
            faults,
            extra_args: vec!["--auth-tokens".into(), tokens.display().to_string()],
            ..Options::default()
        },
    )
    .await
}

fn bearer(token: &str) -> (&'static str, Vec<u8>) {
    ("authorization", format!("Bearer {token}").into_bytes())
}

/// A debit of `amount` on `account` with `key`, the given `Authorization` (if any) and
/// `X-Client-Id` (if any).
async fn debit(
    svc: &Service,
    token: Option<&str>,
    client: Option<&str>,
    key: &str,
    account: &str,
    amount: i64,
) -> Reply {
    let authorization = token.map(bearer);
    let mut headers: Vec<(&str, &[u8])> = vec![("idempotency-key", key.as_bytes()), FORM];
    if let Some((name, value)) = &authorization {
        headers.push((name, value));
    }
    if let Some(client) = client {
        headers.push(("x-client-id", client.as_bytes()));
    }
    svc.send(svc.post(
        &svc.public,
        &format!("/accounts/{account}/debits"),
        &headers,
        format!("amount={amount}"),
    ))
    .await
    .expect("debit request")
}

/// A grant on the admin listener with the given `Authorization` (if any), as `ops`.
async fn grant(svc: &Service, token: Option<&str>, key: &str, account: &str, amount: i64) -> Reply {
    let authorization = token.map(bearer);
    let mut headers: Vec<(&str, &[u8])> = vec![
        ("idempotency-key", key.as_bytes()),
        ("x-client-id", b"ops"),
        JSON,
    ];
    if let Some((name, value)) = &authorization {
        headers.push((name, value));
    }
    svc.send(svc.post(
        &svc.admin,
        &format!("/accounts/{account}/grants"),
        &headers,
        json!({ "amount": amount }).to_string(),
    ))
    .await
    .expect("grant request")
}

/// `GET {base}{path}` with the given `Authorization` (if any).
async fn get(svc: &Service, base: &str, path: &str, token: Option<&str>) -> Reply {
    let mut request = svc.http.get(format!("{base}{path}"));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    svc.send(request).await.expect("GET request")
}

fn assert_refused(reply: &Reply, status: u16, outcome: &str, what: &str) {
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
}

fn challenge(reply: &Reply) -> &str {
    reply
        .headers
        .get("www-authenticate")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
}

/// A missing, unknown or other-scheme token is 401 with a problem body and a Bearer
/// challenge, and records nothing; a malformed header is 400; the probes need no token.
#[tokio::test]
async fn missing_or_unknown_token_is_401_and_records_nothing() {
    let db = TestDb::new("a_401").await;
    let (_dir, tokens) = token_file();
    let svc = start(&db, &tokens, false).await;
    assert_eq!(
        grant(&svc, Some(TOKEN_OPS), "g-1", "acct-0001", 100)
            .await
            .status,
        201
    );
    let before = db.recorded().await;

    let missing = debit(&svc, None, Some("app-a"), "k-1", "acct-0001", 10).await;
    assert_refused(&missing, 401, "UNAUTHENTICATED", "no token");
    assert_eq!(challenge(&missing), "Bearer realm=\"ledger-svc\"");

    let unknown = debit(
        &svc,
        Some(UNKNOWN_TOKEN),
        Some("app-a"),
        "k-1",
        "acct-0001",
        10,
    )
    .await;
    assert_refused(&unknown, 401, "UNAUTHENTICATED", "unknown token");
    assert_eq!(
        challenge(&unknown),
        "Bearer realm=\"ledger-svc\", error=\"invalid_token\""
    );

    let basic = svc
        .send(svc.post(
            &svc.public,
            "/accounts/acct-0001/debits",
            &[
                ("idempotency-key", b"k-1"),
                ("x-client-id", b"app-a"),
                ("authorization", b"Basic YXBwLWE6cGFzcw=="),
                FORM,
            ],
            "amount=10",
        ))
        .await
        .expect("debit request");
    assert_refused(&basic, 401, "UNAUTHENTICATED", "Basic scheme");
    assert!(
        challenge(&basic).starts_with("Bearer"),
        "{}",
        challenge(&basic)
    );

    let malformed = svc
        .send(svc.post(
            &svc.public,
            "/accounts/acct-0001/debits",
            &[
                ("idempotency-key", b"k-1"),
                ("authorization", b"Bearer two words"),
                FORM,
            ],
            "amount=10",
        ))
        .await
        .expect("debit request");
    assert_refused(&malformed, 400, "BAD_REQUEST", "malformed bearer token");
    assert_eq!(
        challenge(&malformed),
        "Bearer realm=\"ledger-svc\", error=\"invalid_request\""
    );

    assert_eq!(
        db.recorded().await,
        before,
        "a refused request recorded something"
    );
    assert_eq!(db.balance("acct-0001").await, 100);

    // Every other route too, the balance read and the spot routes included.
    let read = get(&svc, &svc.public, "/accounts/acct-0001", None).await;
    assert_refused(&read, 401, "UNAUTHENTICATED", "balance without a token");
    let spot = get(&svc, &svc.public, "/spot/accounts/alice/balances", None).await;
    assert_refused(&spot, 401, "UNAUTHENTICATED", "spot without a token");
    let read = get(&svc, &svc.public, "/accounts/acct-0001", Some(TOKEN_A)).await;
    assert_eq!(
        (read.status, read.body["balance"].as_i64()),
        (200, Some(100))
    );

    // The probes and the service's description stay open on both listeners.
    for base in [&svc.public, &svc.admin] {
        for probe in ["/healthz", "/readyz", "/openapi.json"] {
            assert_eq!(
                get(&svc, base, probe, None).await.status,
                200,
                "{base}{probe}"
            );
        }
    }
}

/// The token's caller scopes the keys: another client's `X-Client-Id` is 403 and records
/// nothing (no replay of that client's response); the same key under the caller's own id
/// is an independent request; `X-Client-Id` may be left out.
#[tokio::test]
async fn another_clients_id_is_403_and_the_key_is_scoped_by_the_caller() {
    let db = TestDb::new("a_403").await;
    let (_dir, tokens) = token_file();
    let svc = start(&db, &tokens, false).await;
    grant(&svc, Some(TOKEN_OPS), "g-1", "acct-0001", 100).await;

    // A, without X-Client-Id: scoped by the token's id.
    let first = debit(&svc, Some(TOKEN_A), None, "k-1", "acct-0001", 10).await;
    assert_eq!(
        (first.status, first.body["balance"].as_i64()),
        (201, Some(90))
    );
    let txn_a = first.body["txn_id"].as_i64().unwrap();
    // A again, naming itself: the replay.
    let again = debit(&svc, Some(TOKEN_A), Some("app-a"), "k-1", "acct-0001", 10).await;
    assert!(again.replayed(), "{}", again.raw);
    assert_eq!(again.body["txn_id"].as_i64(), Some(txn_a));

    // B with A's id and key: 403, A's response not shown, nothing recorded.
    let before = db.recorded().await;
    let borrowed = debit(&svc, Some(TOKEN_B), Some("app-a"), "k-1", "acct-0001", 10).await;
    assert_refused(&borrowed, 403, "FORBIDDEN", "B naming A");
    assert!(borrowed.body["txn_id"].is_null() && borrowed.body["balance"].is_null());
    assert!(!borrowed.replayed());
    assert_eq!(db.recorded().await, before, "the 403 recorded something");

    // B with the same key under its own id: its own debit.
    let own = debit(&svc, Some(TOKEN_B), Some("app-b"), "k-1", "acct-0001", 10).await;
    assert_eq!((own.status, own.replayed()), (201, false), "{}", own.raw);
    assert_ne!(own.body["txn_id"].as_i64(), Some(txn_a));
    assert_eq!(own.body["balance"].as_i64(), Some(80));

    let rows: Vec<(String, String)> = db
        .client
        .query(
            "SELECT client_id, idem_key FROM idem_request ORDER BY client_id, idem_key",
            &[],
        )
        .await
        .expect("read idem_request")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let rows: Vec<(&str, &str)> = rows.iter().map(|(c, k)| (c.as_str(), k.as_str())).collect();
    assert_eq!(
        rows,
        [("app-a", "k-1"), ("app-b", "k-1"), ("ops", "g-1")],
        "keys recorded under the authenticated ids"
    );
}

/// The admin listener needs an admin token (401 without, 403 with a non-admin one), the
/// fault routes too; without `--enable-fault-injection` they do not exist even for an
/// admin (404).
#[tokio::test]
async fn the_admin_listener_and_the_fault_routes_need_an_admin_token() {
    let db = TestDb::new("a_admin").await;
    let (_dir, tokens) = token_file();
    let svc = start(&db, &tokens, true).await;
    let before = db.recorded().await;
    assert_refused(
        &grant(&svc, None, "g-1", "acct-0001", 100).await,
        401,
        "UNAUTHENTICATED",
        "grant without a token",
    );
    let not_admin = grant(&svc, Some(TOKEN_A), "g-1", "acct-0001", 100).await;
    assert_refused(&not_admin, 403, "FORBIDDEN", "grant with a non-admin token");
    assert_eq!(
        db.recorded().await,
        before,
        "a refused grant recorded something"
    );
    assert_eq!(
        grant(&svc, Some(TOKEN_OPS), "g-1", "acct-0001", 100)
            .await
            .status,
        201
    );

    // A transfer between two accounts (admin): the admin's own id scopes its key; an
    // X-Client-Id naming another client is 403 there too.
    let transfer = |client: Option<&'static str>, key: &'static str| {
        let mut request = svc
            .http
            .post(format!("{}/transfers", svc.admin))
            .bearer_auth(TOKEN_OPS)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(json!({"from": "acct-0001", "to": "acct-0002", "amount": 10}).to_string());
        if let Some(client) = client {
            request = request.header("x-client-id", client);
        }
        svc.send(request)
    };
    let before = db.recorded().await;
    let borrowed = transfer(Some("app-a"), "t-1")
        .await
        .expect("transfer request");
    assert_refused(
        &borrowed,
        403,
        "FORBIDDEN",
        "transfer naming another client",
    );
    assert_eq!(
        db.recorded().await,
        before,
        "the refused transfer recorded something"
    );
    let own = transfer(None, "t-1").await.expect("transfer request");
    assert_eq!(own.status, 201, "{}", own.raw);
    let scoped: String = db
        .client
        .query_one(
            "SELECT client_id FROM idem_request WHERE idem_key = 't-1'",
            &[],
        )
        .await
        .expect("read idem_request")
        .get(0);
    assert_eq!(scoped, "ops");

    assert_refused(
        &get(&svc, &svc.admin, "/faults", None).await,
        401,
        "UNAUTHENTICATED",
        "faults without a token",
    );
    assert_refused(
        &get(&svc, &svc.admin, "/faults", Some(TOKEN_B)).await,
        403,
        "FORBIDDEN",
        "faults with a non-admin token",
    );
    let listed = get(&svc, &svc.admin, "/faults", Some(TOKEN_OPS)).await;
    assert_eq!(listed.status, 200, "{}", listed.raw);
    assert!(listed.body["faults"].is_array());
    let armed = svc
        .send(
            svc.http
                .put(format!("{}/faults/after-commit", svc.admin))
                .bearer_auth(TOKEN_A)
                .header("content-type", "application/json")
                .body(json!({"action": "close", "hold_ms": 0, "count": 1}).to_string()),
        )
        .await
        .expect("arm request");
    assert_refused(&armed, 403, "FORBIDDEN", "arming with a non-admin token");
    drop(svc);

    let db = TestDb::new("a_admin_nofaults").await;
    let svc = start(&db, &tokens, false).await;
    let absent = get(&svc, &svc.admin, "/faults", Some(TOKEN_OPS)).await;
    assert_eq!(absent.status, 404, "{}", absent.raw);
}

/// The token file holds hashes; the service's log names callers and hash prefixes, never
/// a token (neither a listed one nor an unknown one it was sent); without the flag the
/// start-up line says auth is off.
#[tokio::test]
async fn tokens_are_neither_on_disk_nor_in_the_log() {
    let db = TestDb::new("a_log").await;
    let (_dir, tokens) = token_file();
    let on_disk = std::fs::read_to_string(&tokens).expect("read the token file");
    let svc = start(&db, &tokens, true).await;
    grant(&svc, Some(TOKEN_OPS), "g-1", "acct-0001", 100).await;
    debit(&svc, Some(TOKEN_A), None, "k-1", "acct-0001", 10).await;
    debit(&svc, Some(TOKEN_B), Some("app-a"), "k-1", "acct-0001", 10).await;
    debit(&svc, Some(UNKNOWN_TOKEN), None, "k-2", "acct-0001", 10).await;
    get(&svc, &svc.admin, "/faults", Some(TOKEN_OPS)).await;
    // The request lines are written after the responses; wait for the last one.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while svc.log_lines("route=/faults").is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let log = svc.log_lines("");
    let text = log.join("\n");

    for (token, client, admin) in CALLERS {
        assert!(
            !on_disk.contains(token),
            "the token file holds {client}'s token"
        );
        assert!(on_disk.contains(&sha256_hex(token)));
        assert!(
            !text.contains(token),
            "the log holds {client}'s token:\n{text}"
        );
        assert!(
            text.contains(&format!(
                "caller client_id={client} admin={} token_sha256={}",
                if admin { "yes" } else { "no" },
                &sha256_hex(token)[..12]
            )),
            "no start-up line for {client}:\n{text}"
        );
    }
    assert!(
        !text.contains(UNKNOWN_TOKEN),
        "the log holds the unknown token"
    );
    assert!(!text.contains(&sha256_hex(UNKNOWN_TOKEN)[..12]));
    assert!(text.contains("auth=tokens(callers=4 admins=2)"), "{text}");
    // The request lines name the authenticated caller.
    let debit_a = svc.log_lines("key=k-1 ");
    assert!(
        debit_a
            .iter()
            .any(|line| line.contains("caller=app-a") && line.contains("status=201")),
        "{debit_a:?}"
    );
    assert!(
        log.iter()
            .any(|line| line.contains("caller=app-b") && line.contains("status=403")),
        "{text}"
    );
    drop(svc);

    let db = TestDb::new("a_log_off").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    assert!(
        !svc.log_lines("auth=off(").is_empty(),
        "no auth=off in the start-up line"
    );
}

/// A token file that does not parse, or names no caller, refuses the start (status 2)
/// with the line named; a missing file too.
#[test]
fn a_bad_token_file_refuses_the_start() {
    let dir = tempfile::tempdir().expect("temp folder");
    let hash = sha256_hex(TOKEN_A);
    for (name, text, wanted) in [
        ("empty", String::new(), "no caller listed"),
        (
            "fields",
            format!("{hash} app-a\n"),
            "line 1: expected 3 fields",
        ),
        (
            "admin",
            format!("# c\n{hash} app-a sure\n"),
            "line 2: the admin field",
        ),
        (
            "hash",
            format!("{TOKEN_A} app-a no\n"),
            "line 1: the token hash",
        ),
        (
            "twice",
            format!("{hash} app-a no\n{hash} app-b no\n"),
            "line 2: this token hash is listed twice",
        ),
        ("missing", String::new(), "cannot read the token file"),
    ] {
        let path = dir.path().join(name);
        if name != "missing" {
            std::fs::write(&path, text).expect("write");
        }
        let output = Command::new(env!("CARGO_BIN_EXE_ledger-svc"))
            .args(["--database-url", "postgresql://postgres@127.0.0.1:9/none"])
            .arg("--auth-tokens")
            .arg(&path)
            .output()
            .expect("run ledger-svc");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(wanted), "{name}: {stderr}");
        assert!(output.stdout.is_empty(), "{name}: it listened");
    }
}
