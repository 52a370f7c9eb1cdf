//! The HTTP contract of the spot routes (SPEC §8 served by `ledger-svc`), against the real
//! binary and a real PostgreSQL 16: every route and outcome with its replay, tenants,
//! listeners, every class of malformed input (400/403/413/415, nothing recorded, the
//! same business id then succeeds), the spot fault points (an event kind only where it
//! passes), no system account's balances, and with `--auth-tokens` 401/403 on every spot
//! route and the tenant rule (the tenant is the caller).

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::TestDb;
use common::service::{Options, Reply, Service};
use common::tokens::{TOKEN_A, TOKEN_A_ADMIN, TOKEN_B, TOKEN_OPS, token_file};

const JSON: (&str, &[u8]) = ("content-type", b"application/json");
const TENANT: (&str, &[u8]) = ("x-tenant-id", b"default");

/// A database with both the ledger's and the spot tables.
async fn spot_db(name: &str) -> TestDb {
    let db = TestDb::new(name).await;
    frozen_balances::schema::install_and_seed(&db.client)
        .await
        .expect("spot schema");
    db
}

/// What a refused request must leave alone: operations, movements, orders, and every
/// balance row.
async fn recorded(db: &TestDb) -> String {
    let row = db
        .client
        .query_one(
            "SELECT (SELECT count(*) FROM balance_operation)::text || '/' ||
                    (SELECT count(*) FROM balance_movement)::text || '/' ||
                    (SELECT count(*) FROM spot_order)::text || '/' ||
                    (SELECT string_agg(account_id || asset || available || ':' || frozen, ','
                                       ORDER BY tenant_id, account_id, asset) FROM balance)",
            &[],
        )
        .await
        .unwrap();
    row.get(0)
}

fn assert_problem(reply: &Reply, status: u16, outcome: &str, what: &str) {
    assert_eq!(reply.status, status, "{what}: {}", reply.raw);
    assert_eq!(
        reply.content_type(),
        "application/problem+json",
        "{what}: {}",
        reply.raw
    );
    assert_eq!(reply.outcome(), outcome, "{what}: {}", reply.raw);
    for member in ["type", "title", "detail"] {
        assert!(reply.body[member].is_string(), "{what}: no {member}");
    }
    assert!(!reply.replayed(), "{what}: marked replayed");
    let text = reply.raw.to_lowercase();
    for driver_text in ["sqlstate", "db error", "postgres", "tokio"] {
        assert!(!text.contains(driver_text), "{what}: driver text: {text}");
    }
}

/// `POST {base}{path}` with `headers` and a raw body.
async fn post(
    svc: &Service,
    base: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &str,
) -> Reply {
    svc.send(svc.post(base, path, headers, body.to_owned()))
        .await
        .expect("request")
}

async fn deposit(
    svc: &Service,
    tenant: &str,
    key: &str,
    account: &str,
    asset: &str,
    amount: &str,
) -> Reply {
    post(
        svc,
        &svc.admin,
        &format!("/spot/accounts/{account}/deposits"),
        &[
            ("x-tenant-id", tenant.as_bytes()),
            ("idempotency-key", key.as_bytes()),
            JSON,
        ],
        &json!({"asset": asset, "amount": amount}).to_string(),
    )
    .await
}

async fn place(
    svc: &Service,
    tenant: &str,
    key: &str,
    account: &str,
    side: &str,
    quantity: &str,
    price: &str,
) -> Reply {
    post(
        svc,
        &svc.public,
        &format!("/spot/accounts/{account}/orders"),
        &[
            ("x-tenant-id", tenant.as_bytes()),
            ("idempotency-key", key.as_bytes()),
            JSON,
        ],
        &json!({"market": "BTC-USDT", "side": side, "quantity": quantity, "price": price})
            .to_string(),
    )
    .await
}

async fn fill(
    svc: &Service,
    key: &str,
    buy: &Value,
    sell: &Value,
    quantity: &str,
    price: &str,
) -> Reply {
    post(
        svc,
        &svc.admin,
        "/spot/fills",
        &[TENANT, ("idempotency-key", key.as_bytes()), JSON],
        &json!({"buy_order_id": buy, "sell_order_id": sell, "quantity": quantity, "price": price})
            .to_string(),
    )
    .await
}

async fn cancel(svc: &Service, key: &str, account: &str, order: &Value) -> Reply {
    post(
        svc,
        &svc.public,
        &format!("/spot/accounts/{account}/orders/{order}/cancel"),
        &[TENANT, ("idempotency-key", key.as_bytes())],
        "",
    )
    .await
}

async fn balances(svc: &Service, tenant: &str, account: &str) -> Reply {
    svc.send(
        svc.http
            .get(format!("{}/spot/accounts/{account}/balances", svc.public))
            .header("x-tenant-id", tenant),
    )
    .await
    .unwrap()
}

fn asset_line(reply: &Reply, asset: &str) -> String {
    let row = reply.body["balances"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["asset"] == asset)
        .unwrap_or_else(|| panic!("no {asset}: {}", reply.raw));
    format!(
        "{} {}",
        row["available"].as_str().unwrap(),
        row["frozen"].as_str().unwrap()
    )
}

fn assert_replay_of(again: &Reply, first: &Reply) {
    assert_eq!(again.status, first.status, "{}", again.raw);
    assert!(again.replayed(), "not marked replayed: {}", again.raw);
    assert_eq!(again.raw, first.raw);
}

/// Every route and outcome, first time and replayed (SPEC §8 F1/F2 figures on the way).
#[tokio::test]
async fn spot_routes_outcomes_and_replays() {
    let db = spot_db("s_routes").await;
    let svc = Service::start(&db.url(), Options::default()).await;

    let dep = deposit(&svc, "default", "dep-a", "alice", "USDT", "10000").await;
    assert_eq!(dep.status, 201, "{}", dep.raw);
    assert_eq!(dep.body["available"], "10000.000000");
    assert_replay_of(
        &deposit(&svc, "default", "dep-a", "alice", "USDT", "10000").await,
        &dep,
    );
    assert_eq!(
        deposit(&svc, "default", "dep-b", "bob", "BTC", "2")
            .await
            .status,
        201
    );

    // place: 201, replay.
    let buy = place(&svc, "default", "p-a", "alice", "BUY", "1.0000", "5000.00").await;
    assert_eq!(buy.status, 201, "{}", buy.raw);
    assert_eq!(
        (
            buy.body["frozen"].clone(),
            buy.body["fee_reserve"].clone(),
            buy.body["available"].clone()
        ),
        (
            json!("5005.000000"),
            json!("5.000000"),
            json!("4995.000000")
        )
    );
    assert_replay_of(
        &place(&svc, "default", "p-a", "alice", "BUY", "1.0000", "5000.00").await,
        &buy,
    );
    // The same order written differently is the same canonical payload: a replay.
    assert_replay_of(
        &place(&svc, "default", "p-a", "alice", "BUY", "1", "5000").await,
        &buy,
    );
    // 422: the id with another quantity; nothing recorded.
    let before = recorded(&db).await;
    let reused = place(&svc, "default", "p-a", "alice", "BUY", "2.0000", "5000.00").await;
    assert_problem(&reused, 422, "KEY_REUSED", "other quantity");
    assert_eq!(recorded(&db).await, before);

    // 409 INSUFFICIENT, recorded and replayed.
    let poor = place(&svc, "default", "p-x", "alice", "BUY", "1.0000", "5000.00").await;
    assert_problem(&poor, 409, "INSUFFICIENT", "insufficient");
    assert_eq!(poor.body["available"], "4995.000000");
    let poor_again = place(&svc, "default", "p-x", "alice", "BUY", "1.0000", "5000.00").await;
    assert_eq!(poor_again.status, 409);
    assert!(poor_again.replayed());
    assert_eq!(poor_again.raw, poor.raw);

    let sell = place(&svc, "default", "p-b", "bob", "SELL", "1.0000", "4900.00").await;
    assert_eq!(sell.status, 201, "{}", sell.raw);
    let (b, s) = (buy.body["order_id"].clone(), sell.body["order_id"].clone());

    // fill: 201, replay; 422 FILL_REJECTED (price above the buy limit), not recorded.
    let first = fill(&svc, "fill-1", &b, &s, "0.4000", "4900.00").await;
    assert_eq!(first.status, 201, "{}", first.raw);
    assert_eq!(first.body["buyer_returned"], "40.040000");
    assert_eq!(first.body["seller_received"], "1958.040000");
    assert_replay_of(
        &fill(&svc, "fill-1", &b, &s, "0.4000", "4900.00").await,
        &first,
    );
    let before = recorded(&db).await;
    let misfit = fill(&svc, "fill-x", &b, &s, "0.1000", "5000.01").await;
    assert_problem(&misfit, 422, "FILL_REJECTED", "price above the limit");
    let no_order = fill(&svc, "fill-y", &b, &json!(999_999), "0.1000", "4900").await;
    assert_problem(&no_order, 404, "NO_ORDER", "fill of a missing order");
    assert_eq!(recorded(&db).await, before);
    let last = fill(&svc, "fill-2", &b, &s, "0.6000", "4900.00").await;
    assert_eq!(last.status, 201, "{}", last.raw);
    assert_eq!(last.body["buy_status"], "FILLED");

    let alice = balances(&svc, "default", "alice").await;
    assert_eq!(alice.status, 200, "{}", alice.raw);
    assert_eq!(asset_line(&alice, "USDT"), "5095.100000 0.000000");
    assert_eq!(asset_line(&alice, "BTC"), "1.00000000 0.00000000");
    assert_eq!(
        asset_line(&balances(&svc, "default", "bob").await, "USDT"),
        "4895.100000 0.000000"
    );

    // A fill of a filled order: 409 ORDER_CLOSED, recorded and replayed.
    let closed = fill(&svc, "fill-3", &b, &s, "0.1000", "4900").await;
    assert_problem(&closed, 409, "ORDER_CLOSED", "fill of a filled order");
    let closed_again = fill(&svc, "fill-3", &b, &s, "0.1000", "4900").await;
    assert!(closed_again.replayed());
    assert_eq!(closed_again.raw, closed.raw);

    // cancel: F2 on new orders; 201, replay; another cancel id → ORDER_CLOSED.
    let b2 = place(&svc, "default", "p-c", "alice", "BUY", "0.5", "5000").await;
    assert_eq!(b2.status, 201, "{}", b2.raw);
    let order = b2.body["order_id"].clone();
    let cancelled = cancel(&svc, "c-1", "alice", &order).await;
    assert_eq!(cancelled.status, 201, "{}", cancelled.raw);
    assert_eq!(cancelled.body["released"], "2502.500000");
    assert_replay_of(&cancel(&svc, "c-1", "alice", &order).await, &cancelled);
    let twice = cancel(&svc, "c-2", "alice", &order).await;
    assert_problem(&twice, 409, "ORDER_CLOSED", "second cancel");
    let foreign = cancel(&svc, "c-3", "bob", &order).await;
    assert_problem(
        &foreign,
        404,
        "NO_ORDER",
        "cancel of another account's order",
    );
    assert_eq!(
        asset_line(&balances(&svc, "default", "alice").await, "USDT"),
        "5095.100000 0.000000"
    );

    // Tenants: the same business id in another tenant is another event.
    let dep_b = deposit(&svc, "tenant-b", "dep-a", "alice", "USDT", "10000").await;
    assert_eq!(dep_b.status, 201);
    assert!(!dep_b.replayed());
    let other_tenant = place(&svc, "tenant-b", "p-a", "alice", "BUY", "1.0000", "5000.00").await;
    assert_eq!(other_tenant.status, 201, "{}", other_tenant.raw);
    assert!(!other_tenant.replayed());
    assert_ne!(other_tenant.body["order_id"], buy.body["order_id"]);
    assert_eq!(
        asset_line(&balances(&svc, "tenant-b", "alice").await, "USDT"),
        "4995.000000 5005.000000"
    );
    let nobody = balances(&svc, "default", "nobody").await;
    assert_problem(&nobody, 404, "NO_ACCOUNT", "balances of an unknown account");

    let mut client = db.connect().await;
    let findings = frozen_balances::reconcile(&mut client).await.unwrap();
    assert!(findings.is_clean(), "{:#?}", findings.lines());
}

/// Routes live on their listener only; wrong methods are 405.
#[tokio::test]
async fn spot_routes_and_listeners() {
    let db = spot_db("s_listeners").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    let before = recorded(&db).await;
    let headers = [TENANT, ("idempotency-key", b"k-1".as_slice()), JSON];
    for (base, path, body) in [
        (
            &svc.public,
            "/spot/accounts/alice/deposits",
            r#"{"asset":"USDT","amount":"1"}"#,
        ),
        (
            &svc.public,
            "/spot/fills",
            r#"{"buy_order_id":1,"sell_order_id":2,"quantity":"1","price":"1"}"#,
        ),
        (
            &svc.admin,
            "/spot/accounts/alice/orders",
            r#"{"market":"BTC-USDT","side":"BUY","quantity":"1","price":"1"}"#,
        ),
        (&svc.admin, "/spot/accounts/alice/orders/1/cancel", ""),
        (&svc.public, "/spot", ""),
        (&svc.public, "/spot/accounts/alice/orders/1", ""),
        (&svc.public, "/spot/accounts/alice/orders/1/cancel/x", ""),
    ] {
        let reply = post(&svc, base, path, &headers, body).await;
        assert_problem(&reply, 404, "BAD_REQUEST", path);
    }
    let admin_balances = svc
        .send(
            svc.http
                .get(format!("{}/spot/accounts/alice/balances", svc.admin))
                .header("x-tenant-id", "default"),
        )
        .await
        .unwrap();
    assert_problem(&admin_balances, 404, "BAD_REQUEST", "balances on admin");
    // Balances: the tenant header is required, the account id follows the grammar.
    for (what, path, tenant) in [
        ("no tenant", "/spot/accounts/alice/balances", None),
        ("empty tenant", "/spot/accounts/alice/balances", Some("")),
        (
            "tenant with a blank",
            "/spot/accounts/alice/balances",
            Some("a b"),
        ),
        (
            "percent-encoded account",
            "/spot/accounts/al%69ce/balances",
            Some("default"),
        ),
    ] {
        let mut request = svc.http.get(format!("{}{path}", svc.public));
        if let Some(tenant) = tenant {
            request = request.header("x-tenant-id", tenant);
        }
        let reply = svc.send(request).await.unwrap();
        println!(
            "balances {what:<40} -> {} {}",
            reply.status,
            reply.outcome()
        );
        assert_problem(&reply, 400, "BAD_REQUEST", what);
    }
    let wrong = svc
        .send(
            svc.http
                .get(format!("{}/spot/accounts/alice/orders", svc.public)),
        )
        .await
        .unwrap();
    assert_problem(&wrong, 405, "BAD_REQUEST", "GET orders");
    assert_eq!(wrong.headers.get("allow").unwrap(), "POST");
    let wrong = svc
        .send(
            svc.http
                .delete(format!("{}/spot/accounts/alice/balances", svc.public)),
        )
        .await
        .unwrap();
    assert_problem(&wrong, 405, "BAD_REQUEST", "DELETE balances");
    assert_eq!(recorded(&db).await, before);
}

/// One malformed request: what it is, whether it goes to the public listener, path,
/// headers, body, expected status.
type Attempt<'a> = (String, bool, String, Vec<(&'a str, &'a [u8])>, String, u16);

/// Every malformed input of every spot route: its 4xx problem, nothing recorded; then the
/// same business id succeeds with a valid body. The list is printed with --nocapture.
#[tokio::test]
async fn spot_malformed_inputs_change_nothing() {
    let db = spot_db("s_malformed").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    assert_eq!(
        deposit(&svc, "default", "seed-a", "alice", "USDT", "10000")
            .await
            .status,
        201
    );
    assert_eq!(
        deposit(&svc, "default", "seed-b", "bob", "BTC", "2")
            .await
            .status,
        201
    );
    let buy = place(&svc, "default", "seed-p", "alice", "BUY", "1.0", "5000").await;
    let sell = place(&svc, "default", "seed-s", "bob", "SELL", "1.0", "5000").await;
    let (b, s) = (buy.body["order_id"].clone(), sell.body["order_id"].clone());
    let before = recorded(&db).await;

    let key: (&str, &[u8]) = ("idempotency-key", b"k-m");
    let order_body = |q: &str, p: &str| {
        json!({"market": "BTC-USDT", "side": "BUY", "quantity": q, "price": p}).to_string()
    };
    let orders = "/spot/accounts/alice/orders";
    let deposits = "/spot/accounts/alice/deposits";
    let mut attempts: Vec<Attempt> = Vec::new();
    let mut order = |what: &str, body: String| {
        attempts.push((
            what.to_owned(),
            true,
            orders.to_owned(),
            vec![TENANT, key, JSON],
            body,
            400,
        ));
    };
    for quantity in [
        "0.000100001",
        "1e-8",
        "+1",
        "1.",
        ".5",
        "0",
        "-1",
        "0.0000",
        "21000000.0001",
        "0.00015",
        "",
        " 1",
        "1 ",
        "01",
        "1,0",
        "0x1",
        "NaN",
        "١",
        "9999999999999999999999999999999",
    ] {
        order(
            &format!("quantity {quantity:?}"),
            order_body(quantity, "5000.00"),
        );
    }
    for price in [
        "5000.001",
        "5000.005",
        "0",
        "0.00",
        "-5000",
        "+5000",
        "1e3",
        "10000000.01",
        "5000.",
        ".01",
        "",
    ] {
        order(&format!("price {price:?}"), order_body("1.0000", price));
    }
    order(
        "21000000 BTC @ 10000000.00 (notional past bigint)",
        order_body("21000000", "10000000.00"),
    );
    order(
        "200000 BTC @ 10000000.00 (freeze past the USDT maximum)",
        order_body("200000", "10000000.00"),
    );
    for (what, body) in [
        (
            "quantity as a JSON number",
            r#"{"market":"BTC-USDT","side":"BUY","quantity":1,"price":"5000"}"#,
        ),
        (
            "price as a JSON number",
            r#"{"market":"BTC-USDT","side":"BUY","quantity":"1","price":5000.0}"#,
        ),
        (
            "market lower-case",
            r#"{"market":"btc-usdt","side":"BUY","quantity":"1","price":"5000"}"#,
        ),
        (
            "market unknown",
            r#"{"market":"SOL-USDT","side":"BUY","quantity":"1","price":"5000"}"#,
        ),
        (
            "market BTC/USDT",
            r#"{"market":"BTC/USDT","side":"BUY","quantity":"1","price":"5000"}"#,
        ),
        (
            "market null",
            r#"{"market":null,"side":"BUY","quantity":"1","price":"5000"}"#,
        ),
        (
            "side lower-case",
            r#"{"market":"BTC-USDT","side":"buy","quantity":"1","price":"5000"}"#,
        ),
        (
            "side unknown",
            r#"{"market":"BTC-USDT","side":"HOLD","quantity":"1","price":"5000"}"#,
        ),
        (
            "side missing",
            r#"{"market":"BTC-USDT","quantity":"1","price":"5000"}"#,
        ),
        (
            "extra member",
            r#"{"market":"BTC-USDT","side":"BUY","quantity":"1","price":"5000","note":"x"}"#,
        ),
        (
            "repeated member",
            r#"{"market":"BTC-USDT","side":"BUY","quantity":"1","quantity":"1","price":"5000"}"#,
        ),
        ("array", r#"["BTC-USDT","BUY","1","5000"]"#),
        ("empty object", "{}"),
        ("truncated JSON", r#"{"market":"BTC-USDT""#),
        ("empty body", ""),
    ] {
        order(what, body.to_owned());
    }
    let valid = order_body("1.0000", "5000.00");
    let long_key = "k".repeat(256);
    let long_tenant = "t".repeat(65);
    for (what, headers, status) in [
        ("no tenant", vec![key, JSON], 400),
        (
            "empty tenant",
            vec![("x-tenant-id", b"".as_slice()), key, JSON],
            400,
        ),
        (
            "tenant with a blank",
            vec![("x-tenant-id", b"a b".as_slice()), key, JSON],
            400,
        ),
        (
            "tenant of 65 characters",
            vec![("x-tenant-id", long_tenant.as_bytes()), key, JSON],
            400,
        ),
        (
            "two tenants",
            vec![TENANT, ("x-tenant-id", b"other".as_slice()), key, JSON],
            400,
        ),
        ("no business id", vec![TENANT, JSON], 400),
        (
            "empty quoted business id",
            vec![TENANT, ("idempotency-key", b"\"\"".as_slice()), JSON],
            400,
        ),
        (
            "business id of 256 characters",
            vec![TENANT, ("idempotency-key", long_key.as_bytes()), JSON],
            400,
        ),
        (
            "business id with a blank",
            vec![TENANT, ("idempotency-key", b"k m".as_slice()), JSON],
            400,
        ),
        (
            "two business ids",
            vec![TENANT, key, ("idempotency-key", b"k-n".as_slice()), JSON],
            400,
        ),
        ("no content type", vec![TENANT, key], 415),
        (
            "form content type",
            vec![
                TENANT,
                key,
                (
                    "content-type",
                    b"application/x-www-form-urlencoded".as_slice(),
                ),
            ],
            415,
        ),
        (
            "text/plain",
            vec![TENANT, key, ("content-type", b"text/plain".as_slice())],
            415,
        ),
    ] {
        attempts.push((
            what.to_owned(),
            true,
            orders.to_owned(),
            headers,
            valid.clone(),
            status,
        ));
    }
    attempts.push((
        "body over 4 KiB".into(),
        true,
        orders.into(),
        vec![TENANT, key, JSON],
        format!(
            r#"{{"market":"BTC-USDT","side":"BUY","quantity":"1","price":"5000","pad":"{}"}}"#,
            "x".repeat(5000)
        ),
        413,
    ));
    for (what, path, status) in [
        ("system account", "/spot/accounts/sys-fee/orders", 403),
        (
            "percent-encoded account",
            "/spot/accounts/al%69ce/orders",
            400,
        ),
        (
            "account of 65 characters",
            &*format!("/spot/accounts/{}/orders", "a".repeat(65)),
            400,
        ),
    ] {
        attempts.push((
            what.to_owned(),
            true,
            path.to_owned(),
            vec![TENANT, key, JSON],
            valid.clone(),
            status,
        ));
    }
    // Deposits (admin).
    for (what, body) in [
        ("deposit 1e-8", r#"{"asset":"BTC","amount":"1e-8"}"#),
        (
            "deposit 9 places of BTC",
            r#"{"asset":"BTC","amount":"0.000100001"}"#,
        ),
        (
            "deposit 7 places of USDT",
            r#"{"asset":"USDT","amount":"0.0000001"}"#,
        ),
        (
            "deposit over the BTC maximum",
            r#"{"asset":"BTC","amount":"21000000.00000001"}"#,
        ),
        (
            "deposit over the USDT maximum",
            r#"{"asset":"USDT","amount":"1000000000000.000001"}"#,
        ),
        ("deposit 0", r#"{"asset":"USDT","amount":"0"}"#),
        ("deposit -1", r#"{"asset":"USDT","amount":"-1"}"#),
        ("deposit +1", r#"{"asset":"USDT","amount":"+1"}"#),
        ("deposit as a number", r#"{"asset":"USDT","amount":10}"#),
        (
            "deposit asset lower-case",
            r#"{"asset":"usdt","amount":"10"}"#,
        ),
        ("deposit asset unknown", r#"{"asset":"SOL","amount":"10"}"#),
        ("deposit without asset", r#"{"amount":"10"}"#),
    ] {
        attempts.push((
            what.to_owned(),
            false,
            deposits.to_owned(),
            vec![TENANT, key, JSON],
            body.to_owned(),
            400,
        ));
    }
    attempts.push((
        "deposit to a system account".into(),
        false,
        "/spot/accounts/sys-deposit/deposits".into(),
        vec![TENANT, key, JSON],
        r#"{"asset":"USDT","amount":"10"}"#.into(),
        403,
    ));
    // Fills (admin).
    let fill_body = |buy: &Value, sell: &Value, q: &str, p: &str| {
        json!({"buy_order_id": buy, "sell_order_id": sell, "quantity": q, "price": p}).to_string()
    };
    for (what, body) in [
        (
            "fill quantity off the lot",
            fill_body(&b, &s, "0.00001", "5000"),
        ),
        (
            "fill quantity 9 places",
            fill_body(&b, &s, "0.000100001", "5000"),
        ),
        (
            "fill price off the tick",
            fill_body(&b, &s, "0.1", "5000.001"),
        ),
        ("fill quantity 0", fill_body(&b, &s, "0", "5000")),
        ("fill same order twice", fill_body(&b, &b, "0.1", "5000")),
        ("fill order id 0", fill_body(&json!(0), &s, "0.1", "5000")),
        (
            "fill order id negative",
            fill_body(&json!(-1), &s, "0.1", "5000"),
        ),
        (
            "fill order id as a string",
            fill_body(&json!(b.to_string()), &s, "0.1", "5000"),
        ),
        (
            "fill order id fractional",
            fill_body(&json!(1.5), &s, "0.1", "5000"),
        ),
        (
            "fill order id past 64 bits",
            fill_body(&json!(u64::MAX), &s, "0.1", "5000"),
        ),
        (
            "fill quantity as a number",
            fill_body(&b, &s, "x", "5000").replace("\"x\"", "0.1"),
        ),
    ] {
        attempts.push((
            what.to_owned(),
            false,
            "/spot/fills".to_owned(),
            vec![TENANT, key, JSON],
            body,
            400,
        ));
    }
    // Cancels (public).
    for (what, path, headers, body, status) in [
        (
            "cancel order id 0",
            "/spot/accounts/alice/orders/0/cancel",
            vec![TENANT, key],
            "",
            400,
        ),
        (
            "cancel order id 01",
            "/spot/accounts/alice/orders/01/cancel",
            vec![TENANT, key],
            "",
            400,
        ),
        (
            "cancel order id x",
            "/spot/accounts/alice/orders/x/cancel",
            vec![TENANT, key],
            "",
            400,
        ),
        (
            "cancel order id -1",
            "/spot/accounts/alice/orders/-1/cancel",
            vec![TENANT, key],
            "",
            400,
        ),
        (
            "cancel order id past 64 bits",
            "/spot/accounts/alice/orders/9223372036854775808/cancel",
            vec![TENANT, key],
            "",
            400,
        ),
        (
            "cancel with a body",
            &*format!("/spot/accounts/alice/orders/{b}/cancel"),
            vec![TENANT, key, JSON],
            "{}",
            400,
        ),
        (
            "cancel without tenant",
            &*format!("/spot/accounts/alice/orders/{b}/cancel"),
            vec![key],
            "",
            400,
        ),
        (
            "cancel without business id",
            &*format!("/spot/accounts/alice/orders/{b}/cancel"),
            vec![TENANT],
            "",
            400,
        ),
        (
            "cancel by a system account",
            &*format!("/spot/accounts/sys-fee/orders/{b}/cancel"),
            vec![TENANT, key],
            "",
            403,
        ),
    ] {
        attempts.push((
            what.to_owned(),
            true,
            path.to_owned(),
            headers,
            body.to_owned(),
            status,
        ));
    }

    for (what, public, path, headers, body, status) in attempts {
        let base = if public { &svc.public } else { &svc.admin };
        let reply = post(&svc, base, &path, &headers, &body).await;
        let shown: String = body.chars().take(60).collect();
        println!(
            "{what:<56} {shown:<62} -> {} {}",
            reply.status,
            reply.outcome()
        );
        assert_problem(&reply, status, "BAD_REQUEST", &format!("{what}: {shown}"));
        if reply.status == 400 {
            assert!(reply.body["detail"].as_str().is_some_and(|d| !d.is_empty()));
        }
        assert_eq!(
            recorded(&db).await,
            before,
            "{what}: something was recorded"
        );
    }

    // Nothing above registered k-m: it now works for each route in turn (a business id
    // names one event: a placement first, then other ids for the others).
    let fresh = place(&svc, "default", "k-m", "alice", "BUY", "0.0001", "5000.00").await;
    assert_eq!(fresh.status, 201, "{}", fresh.raw);
    assert!(!fresh.replayed());
    let mut client = db.connect().await;
    assert!(
        frozen_balances::reconcile(&mut client)
            .await
            .unwrap()
            .is_clean()
    );
}

/// The spot fault points are armed through the existing fault routes: after-commit close
/// (committed, no response, same-id retry replays), balances-updated close (rolled back:
/// no operation, no movement, balance unchanged; the same id then freezes once).
#[tokio::test]
async fn spot_fault_points() {
    let db = spot_db("s_faults").await;
    let svc = Service::start(
        &db.url(),
        Options {
            faults: true,
            ..Options::default()
        },
    )
    .await;
    assert_eq!(
        deposit(&svc, "default", "dep-a", "alice", "USDT", "10000")
            .await
            .status,
        201
    );
    let names: Vec<String> = svc.faults().await.body["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["point"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        names[4..],
        [
            "spot-registered",
            "spot-balances-updated",
            "spot-before-commit",
            "spot-after-commit"
        ]
    );

    svc.arm(
        "spot-after-commit",
        json!({"action": "close", "hold_ms": 200}),
    )
    .await;
    let started = Instant::now();
    let lost = svc
        .send(svc.post(
            &svc.public,
            "/spot/accounts/alice/orders",
            &[TENANT, ("idempotency-key", b"p-1"), JSON],
            json!({"market":"BTC-USDT","side":"BUY","quantity":"1.0","price":"5000"}).to_string(),
        ))
        .await;
    assert!(lost.is_err(), "a response arrived despite the fault");
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        asset_line(&balances(&svc, "default", "alice").await, "USDT"),
        "4995.000000 5005.000000"
    );
    let retry = place(&svc, "default", "p-1", "alice", "BUY", "1.0", "5000").await;
    assert_eq!(retry.status, 201);
    assert!(retry.replayed());
    // A fault narrowed to an event kind is armed only where such an event passes: no
    // route of the service runs a withdrawal, and ledger points see no event kind.
    for (point, event) in [
        ("spot-before-commit", "WITHDRAW"),
        ("before-commit", "FILL"),
    ] {
        let refused = svc
            .send(
                svc.http
                    .put(format!("{}/faults/{point}", svc.admin))
                    .header("content-type", "application/json")
                    .body(json!({"action": "close", "event": event}).to_string()),
            )
            .await
            .expect("arm request");
        assert_problem(&refused, 400, "BAD_REQUEST", &format!("{event} at {point}"));
    }
    // A system account's balances are the exchange's books: not served.
    let books = balances(&svc, "default", "sys-deposit").await;
    assert_problem(&books, 403, "BAD_REQUEST", "sys-deposit balances");
    // A ledger fault point does not fire inside a spot event.
    svc.arm("after-commit", json!({"action": "close"})).await;
    assert_eq!(
        place(&svc, "default", "p-0", "alice", "SELL", "0.0001", "5000")
            .await
            .status,
        409
    );

    svc.arm("spot-balances-updated", json!({"action": "close"}))
        .await;
    let before = recorded(&db).await;
    let failed = svc
        .send(svc.post(
            &svc.public,
            "/spot/accounts/alice/orders",
            &[TENANT, ("idempotency-key", b"p-2"), JSON],
            json!({"market":"BTC-USDT","side":"BUY","quantity":"0.5","price":"5000"}).to_string(),
        ))
        .await;
    assert!(failed.is_err());
    assert_eq!(
        recorded(&db).await,
        before,
        "rolled back: nothing of p-2 remains"
    );
    let second = place(&svc, "default", "p-2", "alice", "BUY", "0.5", "5000").await;
    assert_eq!(second.status, 201, "{}", second.raw);
    assert!(!second.replayed());
    assert_eq!(
        asset_line(&balances(&svc, "default", "alice").await, "USDT"),
        "2492.500000 7507.500000"
    );
    let mut client = db.connect().await;
    assert!(
        frozen_balances::reconcile(&mut client)
            .await
            .unwrap()
            .is_clean()
    );
}

/// A spot request with the given token (if any) and headers; `body` empty for a GET.
async fn spot(
    svc: &Service,
    admin: bool,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<serde_json::Value>,
) -> Reply {
    let base = if admin { &svc.admin } else { &svc.public };
    let url = format!("{base}{path}");
    let mut request = match &body {
        Some(body) => svc
            .http
            .post(url)
            .header("content-type", "application/json")
            .body(body.to_string()),
        None if path.ends_with("/cancel") => svc.http.post(url),
        None => svc.http.get(url),
    };
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    svc.send(request).await.expect("spot request")
}

/// Spot operations, movements, orders and balance rows, each with its tenant.
async fn spot_recorded(db: &TestDb) -> String {
    db.client
        .query_one(
            "SELECT (SELECT count(*) FROM balance_operation)::text || '/' ||
                    (SELECT count(*) FROM balance_movement)::text || '/' ||
                    (SELECT count(*) FROM spot_order)::text || '/' ||
                    (SELECT string_agg(tenant_id || account_id || asset || available || ':'
                        || frozen, ',' ORDER BY tenant_id, account_id, asset) FROM balance)",
            &[],
        )
        .await
        .expect("read the spot tables")
        .get(0)
}

/// The spot routes authenticate like the ledger's (401 without a token, 403 for another
/// client's `X-Client-Id` or a non-admin on the admin listener) and take the tenant from
/// the caller: another tenant in `X-Tenant-Id` is 403; none of these records anything;
/// a caller's business ids, orders and accounts are its own tenant's.
#[tokio::test]
async fn spot_routes_authenticate_and_the_tenant_is_the_caller() {
    let db = TestDb::new("a_spot").await;
    frozen_balances::schema::install_and_seed(&db.client)
        .await
        .expect("spot schema");
    let (_dir, tokens) = token_file();
    let svc = Service::start(
        &db.url(),
        Options {
            extra_args: vec!["--auth-tokens".into(), tokens.display().to_string()],
            ..Options::default()
        },
    )
    .await;
    let order = json!({"market": "BTC-USDT", "side": "BUY", "quantity": "1.0", "price": "5000"});
    let usdt = json!({"asset": "USDT", "amount": "10000"});
    let orders = "/spot/accounts/alice/orders";
    let deposits = "/spot/accounts/alice/deposits";
    let alice = "/spot/accounts/alice/balances";
    let key = ("idempotency-key", "k-1");
    let before = spot_recorded(&db).await;
    for (what, admin, path, token, headers, body, status, outcome) in [
        (
            "placement without a token",
            false,
            orders,
            None,
            vec![key],
            Some(&order),
            401,
            "UNAUTHENTICATED",
        ),
        (
            "balances without a token",
            false,
            alice,
            None,
            vec![],
            None,
            401,
            "UNAUTHENTICATED",
        ),
        (
            "deposit without a token",
            true,
            deposits,
            None,
            vec![key],
            Some(&usdt),
            401,
            "UNAUTHENTICATED",
        ),
        (
            "placement, another client id",
            false,
            orders,
            Some(TOKEN_A),
            vec![key, ("x-client-id", "app-b")],
            Some(&order),
            403,
            "FORBIDDEN",
        ),
        (
            "balances, another client id",
            false,
            alice,
            Some(TOKEN_A),
            vec![("x-client-id", "app-b")],
            None,
            403,
            "FORBIDDEN",
        ),
        (
            "deposit, another client id",
            true,
            deposits,
            Some(TOKEN_OPS),
            vec![key, ("x-client-id", "app-a")],
            Some(&usdt),
            403,
            "FORBIDDEN",
        ),
        (
            "placement, another tenant",
            false,
            orders,
            Some(TOKEN_A),
            vec![key, ("x-tenant-id", "app-b")],
            Some(&order),
            403,
            "FORBIDDEN",
        ),
        (
            "balances, another tenant",
            false,
            alice,
            Some(TOKEN_A),
            vec![("x-tenant-id", "app-b")],
            None,
            403,
            "FORBIDDEN",
        ),
        (
            "deposit, another tenant",
            true,
            deposits,
            Some(TOKEN_A_ADMIN),
            vec![key, ("x-tenant-id", "app-b")],
            Some(&usdt),
            403,
            "FORBIDDEN",
        ),
        (
            "deposit by a non-admin",
            true,
            deposits,
            Some(TOKEN_A),
            vec![key],
            Some(&usdt),
            403,
            "FORBIDDEN",
        ),
        (
            "a system account's balances",
            false,
            "/spot/accounts/sys-deposit/balances",
            Some(TOKEN_A),
            vec![],
            None,
            403,
            "BAD_REQUEST",
        ),
    ] {
        let reply = spot(&svc, admin, path, token, &headers, body.cloned()).await;
        assert_refused_spot(&reply, status, outcome, what);
        assert!(
            reply.body.get("order_id").is_none() && reply.body.get("balances").is_none(),
            "{what}: {}",
            reply.raw
        );
    }
    assert_eq!(
        spot_recorded(&db).await,
        before,
        "a refused spot request recorded something"
    );

    // A's admin token deposits into A's tenant; A's token places there (the header may
    // name the caller's own tenant, or be left out).
    let funded = spot(
        &svc,
        true,
        deposits,
        Some(TOKEN_A_ADMIN),
        &[("idempotency-key", "d-1")],
        Some(usdt.clone()),
    )
    .await;
    assert_eq!(
        (funded.status, funded.body["tenant_id"].as_str()),
        (201, Some("app-a")),
        "{}",
        funded.raw
    );
    let placed = spot(
        &svc,
        false,
        orders,
        Some(TOKEN_A),
        &[key, ("x-tenant-id", "app-a")],
        Some(order.clone()),
    )
    .await;
    assert_eq!(
        (placed.status, placed.body["tenant_id"].as_str()),
        (201, Some("app-a")),
        "{}",
        placed.raw
    );
    let order_id = placed.body["order_id"].as_i64().expect("order id");

    // B's token, A's business id and body: B's own tenant, where alice has nothing; A's
    // order and A's account are not there, so the placement is refused as freezing from
    // no balance row (404 NO_BALANCE, not recorded: F23), not A's placement replayed.
    let other = spot(
        &svc,
        false,
        orders,
        Some(TOKEN_B),
        &[key],
        Some(order.clone()),
    )
    .await;
    assert_refused_spot(&other, 404, "NO_BALANCE", "B's placement is its own");
    assert!(
        !other.body.to_string().contains(&order_id.to_string())
            || other.body.get("order_id").is_none()
    );
    let cancel = format!("/spot/accounts/alice/orders/{order_id}/cancel");
    let foreign = spot(
        &svc,
        false,
        &cancel,
        Some(TOKEN_B),
        &[("idempotency-key", "c-1")],
        None,
    )
    .await;
    assert_refused_spot(
        &foreign,
        404,
        "NO_ORDER",
        "B cancelling A's order id in its own tenant",
    );
    let mine = spot(&svc, false, alice, Some(TOKEN_A), &[], None).await;
    assert_eq!(mine.status, 200, "{}", mine.raw);
    assert_eq!(mine.body["tenant_id"], "app-a");
    let tenants: Vec<String> = db
        .client
        .query(
            "SELECT DISTINCT tenant_id FROM balance_operation ORDER BY 1",
            &[],
        )
        .await
        .expect("read operations")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(
        tenants,
        ["app-a"],
        "A's operations in A's tenant; B's refused placement recorded nothing"
    );
}

/// A refusal with a problem body and the given outcome (`assert_problem`, any status).
fn assert_refused_spot(reply: &Reply, status: u16, outcome: &str, what: &str) {
    assert_eq!(reply.body["status"], status, "{what}: {}", reply.raw);
    assert_problem(reply, status, outcome, what);
}
