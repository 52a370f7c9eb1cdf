//! `ledger-svc --transfer-mode onetrip`: the SPEC §4 table and its replays byte for byte
//! as in the statement mode, the one fault point that exists (`after-commit`), the three
//! that cannot (409, nothing armed), and the pool's recovery after an immediate restart.

mod common;

use serde_json::json;

use common::TestDb;
use common::service::{Options, Service};

fn onetrip(faults: bool) -> Options {
    Options {
        faults,
        extra_args: vec!["--transfer-mode".into(), "onetrip".into()],
        ..Options::default()
    }
}

/// The same requests against a statement-mode and a one-trip service on two fresh
/// databases: the same statuses, bodies, replay headers, and the same ledger rows.
#[tokio::test]
async fn the_status_table_is_the_same_in_both_modes() {
    let dbs = [
        TestDb::new("ho_table_statements").await,
        TestDb::new("ho_table_onetrip").await,
    ];
    let mut transcripts = Vec::new();
    for (db, options) in dbs.iter().zip([Options::default(), onetrip(false)]) {
        let svc = Service::start(&db.url(), options).await;
        let mut lines = Vec::new();
        let replies = [
            svc.grant("acct-0001", "g-1", 100).await,
            svc.debit("acct-0001", "app-a", "k-1", "30").await,
            svc.debit("acct-0001", "app-a", "k-1", "30").await,
            svc.debit("acct-0001", "app-a", "k-1", "31").await,
            svc.debit("acct-0001", "app-a", "k-2", "500").await,
            svc.debit("acct-0001", "app-a", "k-2", "500").await,
            svc.debit("acct-0404", "app-a", "k-3", "5").await,
            svc.debit("acct-0404", "app-a", "k-3", "5").await,
            svc.debit("acct-0001", "app-a", "k-4", "0").await,
            svc.grant("acct-0404", "g-2", 5).await,
        ];
        for reply in replies {
            lines.push(format!(
                "{} {} {}",
                reply.status,
                reply.replayed(),
                reply.raw
            ));
        }
        lines.push(format!("balance {}", db.balance("acct-0001").await));
        lines.push(format!(
            "requests {} txns {} entries {}",
            db.scalar("SELECT count(*) FROM idem_request").await,
            db.scalar("SELECT count(*) FROM ledger_txn").await,
            db.scalar("SELECT count(*) FROM ledger_entry").await
        ));
        transcripts.push(lines);
    }
    assert_eq!(transcripts[0], transcripts[1]);
    assert!(
        transcripts[0][2].starts_with("201 true"),
        "{:?}",
        transcripts[0]
    );
}

/// Only `after-commit` can be armed: the other ledger points answer 409
/// `point-not-passed` and arm nothing; a `close` after commit loses the response of a
/// committed debit, and the retry replays it.
#[tokio::test]
async fn only_after_commit_can_be_armed() {
    let db = TestDb::new("ho_faults").await;
    let svc = Service::start(&db.url(), onetrip(true)).await;
    assert_eq!(svc.grant("acct-0001", "g-1", 100).await.status, 201);
    for point in ["registered", "entries-written", "before-commit"] {
        let reply = svc
            .send(
                svc.http
                    .put(format!("{}/faults/{point}", svc.admin))
                    .header("content-type", "application/json")
                    .body(r#"{"action": "close"}"#),
            )
            .await
            .unwrap();
        assert_eq!(reply.status, 409, "{}", reply.raw);
        assert_eq!(
            reply.body["type"]
                .as_str()
                .map(|t| t.ends_with("point-not-passed")),
            Some(true),
            "{}",
            reply.raw
        );
    }
    let listing = svc.faults().await;
    assert!(
        listing.body["faults"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f["remaining"] == 0)
    );
    // The spot points are not the ledger's transfer: still armable.
    svc.arm("spot-before-commit", json!({"action": "close", "count": 1}))
        .await;
    svc.send(svc.http.delete(format!("{}/faults", svc.admin)))
        .await
        .unwrap();

    svc.arm(
        "after-commit",
        json!({"action": "close", "hold_ms": 0, "count": 1}),
    )
    .await;
    let lost = svc
        .send(svc.post(
            &svc.public,
            "/accounts/acct-0001/debits",
            &[
                ("x-client-id", b"app-a"),
                ("idempotency-key", b"k-1"),
                ("content-type", b"application/x-www-form-urlencoded"),
            ],
            "amount=30",
        ))
        .await;
    assert!(lost.is_err(), "a response arrived despite the fault");
    assert_eq!(db.balance("acct-0001").await, 70);
    let retry = svc.debit("acct-0001", "app-a", "k-1", "30").await;
    assert_eq!((retry.status, retry.replayed()), (201, true));
    assert_eq!(retry.body["balance"], 70);
}

/// After an immediate restart of PostgreSQL the pool drops the dead connections and the
/// next one-trip debits all succeed.
#[tokio::test]
async fn pool_recovers_after_restart_in_onetrip_mode() {
    common::service::restart_then_debit("ho_restart", onetrip(false)).await;
}
