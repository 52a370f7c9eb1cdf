//! `POST /transfers` on the admin listener (transfers between two user accounts, rows
//! locked in sorted order), against the real binary and a scratch PostgreSQL 16: OK and
//! its replay, INSUFFICIENT, bad input refused with nothing recorded, not on the public
//! listener, and a frozen account refused with 503 and nothing recorded.

mod common;

use common::TestDb;
use common::service::{Options, Reply, Service};

async fn transfer(svc: &Service, base: &str, key: &str, body: &str) -> Reply {
    svc.send(svc.post(
        base,
        "/transfers",
        &[
            ("x-client-id", b"ops"),
            ("idempotency-key", key.as_bytes()),
            ("content-type", b"application/json"),
        ],
        body.to_owned(),
    ))
    .await
    .expect("transfer request")
}

#[tokio::test]
async fn transfers_between_user_accounts() {
    let db = TestDb::new("h_transfers").await;
    let svc = Service::start(&db.url(), Options::default()).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    let admin = svc.admin.clone();

    let body = r#"{"from": "acct-0001", "to": "acct-0002", "amount": 30}"#;
    let ok = transfer(&svc, &admin, "t-1", body).await;
    assert_eq!(ok.status, 201, "{}", ok.raw);
    assert_eq!(ok.body["kind"], "TRANSFER");
    assert_eq!(ok.body["balance"], 70);
    let replay = transfer(&svc, &admin, "t-1", body).await;
    assert_eq!(replay.status, 201, "{}", replay.raw);
    assert!(replay.replayed());
    assert_eq!(replay.body["txn_id"], ok.body["txn_id"]);
    assert_eq!(db.balance("acct-0002").await, 30);

    let too_much = r#"{"from": "acct-0002", "to": "acct-0001", "amount": 31}"#;
    let refused = transfer(&svc, &admin, "t-2", too_much).await;
    assert_eq!((refused.status, refused.outcome()), (409, "INSUFFICIENT"));

    let counted = "SELECT count(*) FROM idem_request";
    let before = db.scalar(counted).await;
    for bad in [
        r#"{"from": "acct-0001", "to": "acct-0001", "amount": 1}"#,
        r#"{"from": "acct-0001", "to": "sys-redeem", "amount": 1}"#,
        r#"{"from": "acct-0001", "to": "acct-0002", "amount": 0}"#,
        r#"{"from": "acct-0001", "to": "acct-0002"}"#,
        "amount=1",
    ] {
        let reply = transfer(&svc, &admin, "t-bad", bad).await;
        assert_eq!(reply.status, 400, "{bad}: {}", reply.raw);
    }
    assert_eq!(
        db.scalar(counted).await,
        before,
        "bad input recorded something"
    );
    let public = svc.public.clone();
    assert_eq!(transfer(&svc, &public, "t-3", body).await.status, 404);

    let client = db.connect().await;
    client
        .execute(
            "INSERT INTO account_freeze (account_id, repair_id) VALUES ('acct-0001', 1)",
            &[],
        )
        .await
        .expect("freeze");
    let frozen = transfer(&svc, &admin, "t-4", body).await;
    assert_eq!(frozen.status, 503, "{}", frozen.raw);
    let debit = svc.debit("acct-0001", "app", "d-1", "5").await;
    assert_eq!(debit.status, 503, "{}", debit.raw);
    assert_eq!(
        db.scalar(counted).await,
        before,
        "a frozen refusal recorded something"
    );
    client
        .execute("DELETE FROM account_freeze", &[])
        .await
        .expect("unfreeze");
    assert_eq!(transfer(&svc, &admin, "t-4", body).await.status, 201);
}

/// `ledger-svc --repair`: one repair of a tampered ledger, its report on stdout, exit 0
/// when the ledger ends clean; a clean ledger is left alone.
#[tokio::test]
async fn repair_command_fixes_a_tampered_balance() {
    let db = TestDb::new("h_repair").await;
    let client = db.connect().await;
    let mut client_mut = db.connect().await;
    points_ledger::grant(&mut client_mut, "ops", "g-1", "acct-0001", 50)
        .await
        .expect("grant");
    client
        .execute(
            "UPDATE account SET balance = balance + 5 WHERE account_id = 'acct-0001'",
            &[],
        )
        .await
        .expect("tamper");
    let url = db.url();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_ledger-svc"))
            .args(["--database-url", &url, "--repair"])
            .output()
            .expect("run ledger-svc --repair")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["unfrozen"], true, "{stdout}");
    assert_eq!(report["frozen"], serde_json::json!(["acct-0001"]));
    assert_eq!(db.balance("acct-0001").await, 50);
    assert_eq!(db.scalar("SELECT count(*) FROM account_freeze").await, 0);
}
