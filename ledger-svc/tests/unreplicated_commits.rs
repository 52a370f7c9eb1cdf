//! Acknowledged means durable (SPEC §4), on every route that acknowledges money, against
//! the real binary and a real PostgreSQL 16 whose synchronous standby never acknowledges
//! (`synchronous_standby_names` names one that does not exist, so every COMMIT that
//! writes waits in `SyncRep` until it is cancelled): a debit in each transfer mode, a
//! grant, a transfer between accounts, a placement, a cancel, a fill and a deposit are
//! each answered 503 `UNKNOWN` when the request bound cancels their wait, although they
//! committed on the primary; their same-key retries (replays) are 503 `UNKNOWN` too,
//! since a replay's cover waits for the standby as well; once the setting is reset, the
//! same retries replay the first attempts. The service's earlier rule (`--planted-bug
//! trust-cancelled-commit`) answers such a debit 201: the test can fail.
//!
//! Its own test binary: the setting is the cluster's (PGC_SIGHUP), and this binary's
//! one test has the cluster to itself.

mod common;

use serde_json::json;

use common::TestDb;
use common::service::{Options, Reply, Service};

const JSON: (&str, &[u8]) = ("content-type", b"application/json");
const TENANT: (&str, &[u8]) = ("x-tenant-id", b"default");
/// The services' request bound, milliseconds: the stalled COMMITs outlast it.
const BOUND_MS: &str = "1000";

/// One request of the routes that acknowledge money, sent again as it is for its retry.
#[derive(Clone)]
struct Route {
    what: &'static str,
    listener: Listener,
    path: String,
    headers: Vec<(&'static str, Vec<u8>)>,
    body: String,
}

#[derive(Clone, Copy)]
enum Listener {
    Public,
    Admin,
}

impl Route {
    async fn send(&self, svc: &Service) -> Reply {
        let base = match self.listener {
            Listener::Public => &svc.public,
            Listener::Admin => &svc.admin,
        };
        let headers: Vec<(&str, &[u8])> = self
            .headers
            .iter()
            .map(|(name, value)| (*name, value.as_slice()))
            .collect();
        svc.send(svc.post(base, &self.path, &headers, self.body.clone()))
            .await
            .expect("request")
    }
}

fn ledger(what: &'static str, listener: Listener, path: String, key: &str, body: String) -> Route {
    Route {
        what,
        listener,
        path,
        headers: vec![
            ("x-client-id", b"ops".to_vec()),
            ("idempotency-key", key.as_bytes().to_vec()),
            (JSON.0, JSON.1.to_vec()),
        ],
        body,
    }
}

fn spot(what: &'static str, listener: Listener, path: String, key: &str, body: String) -> Route {
    Route {
        what,
        listener,
        path,
        headers: vec![
            (TENANT.0, TENANT.1.to_vec()),
            ("idempotency-key", key.as_bytes().to_vec()),
            (JSON.0, JSON.1.to_vec()),
        ],
        body,
    }
}

/// `ALTER SYSTEM SET synchronous_standby_names` to `value` (or RESET) and a reload, seen
/// by a new session.
async fn standby_names(db: &TestDb, value: Option<&str>) {
    let statement = match value {
        Some(value) => format!("ALTER SYSTEM SET synchronous_standby_names = '{value}'"),
        None => "ALTER SYSTEM RESET synchronous_standby_names".to_owned(),
    };
    db.client.batch_execute(&statement).await.unwrap();
    db.client
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    let fresh = db.cluster.connect(&db.name).await.unwrap();
    for _ in 0..500 {
        let now: String = fresh
            .query_one("SHOW synchronous_standby_names", &[])
            .await
            .unwrap()
            .get(0);
        if now == value.unwrap_or("") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("synchronous_standby_names not {value:?} after the reload");
}

/// The routes, on a database whose accounts, balances and two resting orders were
/// written before the standby was named.
async fn routes(svc: &Service) -> Vec<Route> {
    let deposit = |key: &str, account: &str, asset: &str, amount: &str| {
        spot(
            "deposit",
            Listener::Admin,
            format!("/spot/accounts/{account}/deposits"),
            key,
            json!({"asset": asset, "amount": amount}).to_string(),
        )
    };
    let place = |key: &str, account: &str, side: &str| {
        spot(
            "place",
            Listener::Public,
            format!("/spot/accounts/{account}/orders"),
            key,
            json!({"market": "BTC-USDT", "side": side, "quantity": "1.0000", "price": "5000.00"})
                .to_string(),
        )
    };
    for (route, status) in [
        (deposit("u-dep-a", "alice", "USDT", "20000"), 201),
        (deposit("u-dep-b", "bob", "BTC", "2"), 201),
    ] {
        assert_eq!(route.send(svc).await.status, status, "setup {}", route.what);
    }
    let buy = place("u-buy", "alice", "BUY").send(svc).await;
    let sell = place("u-sell", "bob", "SELL").send(svc).await;
    assert_eq!((buy.status, sell.status), (201, 201), "setup orders");
    let (buy, sell) = (buy.body["order_id"].clone(), sell.body["order_id"].clone());
    vec![
        ledger("grant", Listener::Admin, "/accounts/acct-0003/grants".into(), "u-grant", r#"{"amount": 5}"#.into()),
        ledger(
            "transfer",
            Listener::Admin,
            "/transfers".into(),
            "u-transfer",
            r#"{"from": "acct-0001", "to": "acct-0002", "amount": 3}"#.into(),
        ),
        place("u-place", "alice", "BUY"),
        spot(
            "fill",
            Listener::Admin,
            "/spot/fills".into(),
            "u-fill",
            json!({"buy_order_id": buy, "sell_order_id": sell, "quantity": "0.5000", "price": "5000.00"})
                .to_string(),
        ),
        Route {
            headers: vec![
                (TENANT.0, TENANT.1.to_vec()),
                ("idempotency-key", b"u-cancel".to_vec()),
            ],
            ..spot("cancel", Listener::Public, format!("/spot/accounts/alice/orders/{buy}/cancel"), "u-cancel", String::new())
        },
        deposit("u-dep-c", "carol", "USDT", "7"),
    ]
}

fn debit(mode: &str) -> Route {
    let key = format!("u-debit-{mode}");
    let mut route = ledger(
        "debit",
        Listener::Public,
        "/accounts/acct-0001/debits".into(),
        &key,
        r#"{"amount": 1}"#.into(),
    );
    route.what = match mode {
        "statements" => "debit (statements)",
        "onetrip" => "debit (onetrip)",
        _ => "debit (batch)",
    };
    route
}

async fn service(db: &TestDb, mode: &str) -> Service {
    let extra_args = ["--transfer-mode", mode, "--request-timeout-ms", BOUND_MS];
    let options = Options {
        extra_args: extra_args.map(String::from).to_vec(),
        ..Options::default()
    };
    Service::start(&db.url(), options).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_route_acknowledges_a_commit_the_standby_lacks() {
    let db = TestDb::new("h_unreplicated").await;
    frozen_balances::schema::install_and_seed(&db.client)
        .await
        .expect("spot schema");
    let modes = ["statements", "onetrip", "batch"];
    let mut services = Vec::new();
    for mode in modes {
        services.push(service(&db, mode).await);
    }
    assert_eq!(
        services[0].grant("acct-0001", "u-g-1", 100).await.status,
        201
    );
    let mut sent: Vec<(usize, Route)> = routes(&services[0])
        .await
        .into_iter()
        .map(|r| (0, r))
        .collect();
    sent.extend(modes.iter().enumerate().map(|(n, mode)| (n, debit(mode))));
    standby_names(&db, Some("no_such_standby")).await;
    for round in [
        "first attempt",
        "same-key retry while the standby never acknowledges",
    ] {
        for (n, route) in &sent {
            let reply = route.send(&services[*n]).await;
            assert_eq!(
                (reply.status, reply.outcome()),
                (503, "UNKNOWN"),
                "{} ({round}): {}",
                route.what,
                reply.raw
            );
        }
    }
    // The test can fail: the earlier rule (a COMMIT's success trusted after the server's
    // warning) answers a stalled grant 201. (Not a debit: the batch mode's first debit
    // still waits in SyncRep, holding its rows, since its bound cancels nothing.)
    let extra_args = [
        "--request-timeout-ms",
        BOUND_MS,
        "--planted-bug",
        "trust-cancelled-commit",
    ];
    let options = Options {
        extra_args: extra_args.map(String::from).to_vec(),
        ..Options::default()
    };
    let earlier = Service::start(&db.url(), options).await;
    let trusted = ledger(
        "grant",
        Listener::Admin,
        "/accounts/acct-0004/grants".into(),
        "u-grant-trusted",
        r#"{"amount": 5}"#.into(),
    );
    let reply = trusted.send(&earlier).await;
    assert_eq!(
        reply.status, 201,
        "the earlier rule acknowledges the cut COMMIT: {}",
        reply.raw
    );
    standby_names(&db, None).await;
    for (n, route) in &sent {
        let reply = route.send(&services[*n]).await;
        assert!(
            reply.status == 201 && reply.replayed(),
            "{}: once the standby is no longer waited for, the retry replays what committed \
             on the primary: {} {}",
            route.what,
            reply.status,
            reply.raw
        );
    }
}
