//! Integration tests of `reconcile` (SPEC §6 L11) on clean and on crafted data.

mod common;

use points_ledger::{
    BalanceMismatch, Findings, RequestRef, TxnRef, UnbalancedTxn, debit, grant, reconcile,
};

use common::TestDb;

/// A little traffic: grants, debits, a refusal and a NO_ACCOUNT.
async fn traffic(db: &mut TestDb) {
    let c = &mut db.client;
    grant(c, "app-a", "g-1", "acct-0001", 1000).await.unwrap();
    grant(c, "app-a", "g-2", "acct-0002", 50).await.unwrap();
    debit(c, "app-a", "k-1", "acct-0001", 300).await.unwrap();
    debit(c, "app-a", "k-2", "acct-0002", 60).await.unwrap();
    debit(c, "app-a", "k-3", "acct-9999", 1).await.unwrap();
}

#[tokio::test]
async fn fresh_and_busy_databases_are_clean() {
    let mut db = TestDb::new("r_clean").await;
    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
    traffic(&mut db).await;
    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
    assert_eq!(
        findings.summary(),
        "balance_mismatches=0 unbalanced_txns=0 requests_without_txn=0 \
         txns_without_request=0 pending_requests=0 global_sum=0"
    );
}

/// L11 tamper check: +5 on acct-0001 behind the ledger's back.
#[tokio::test]
async fn tampered_balance() {
    let mut db = TestDb::new("r_tamper").await;
    traffic(&mut db).await;
    db.client
        .batch_execute("UPDATE account SET balance = balance + 5 WHERE account_id = 'acct-0001'")
        .await
        .unwrap();
    let findings = reconcile(&mut db.client).await.unwrap();
    assert_eq!(
        findings,
        Findings {
            balance_mismatches: vec![BalanceMismatch {
                account_id: "acct-0001".into(),
                stored: 705,
                recomputed: 700,
            }],
            unbalanced_txns: vec![],
            requests_without_txn: vec![],
            txns_without_request: vec![],
            pending_requests: vec![],
            global_sum: 5,
        }
    );
    assert_eq!(findings.count(), 2);
    assert!(!findings.is_clean());
}

/// A transaction with a single entry, written without a registration: unbalanced AND
/// without request (and the entry itself makes the account's balance mismatch). A
/// transaction with no entry at all shows as well.
#[tokio::test]
async fn single_entry_and_empty_txn() {
    let mut db = TestDb::new("r_unbalanced").await;
    traffic(&mut db).await;
    let single: i64 = db
        .client
        .query_one(
            "WITH t AS (INSERT INTO ledger_txn (client_id, idem_key, kind) \
                        VALUES ('rogue', 'r-1', 'DEBIT') RETURNING txn_id) \
             INSERT INTO ledger_entry (txn_id, account_id, amount) \
             SELECT txn_id, 'acct-0003', 7 FROM t RETURNING txn_id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let empty: i64 = db
        .client
        .query_one(
            "INSERT INTO ledger_txn (client_id, idem_key, kind) \
             VALUES ('rogue', 'r-0', 'GRANT') RETURNING txn_id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(empty > single);

    let findings = reconcile(&mut db.client).await.unwrap();
    assert_eq!(
        findings.unbalanced_txns,
        vec![
            UnbalancedTxn {
                txn_id: single,
                entries: 1,
                sum: 7
            },
            UnbalancedTxn {
                txn_id: empty,
                entries: 0,
                sum: 0
            },
        ]
    );
    assert_eq!(
        findings.txns_without_request,
        vec![
            TxnRef {
                txn_id: single,
                client_id: "rogue".into(),
                idem_key: "r-1".into()
            },
            TxnRef {
                txn_id: empty,
                client_id: "rogue".into(),
                idem_key: "r-0".into()
            },
        ]
    );
    assert_eq!(
        findings.balance_mismatches,
        vec![BalanceMismatch {
            account_id: "acct-0003".into(),
            stored: 0,
            recomputed: 7
        }]
    );
    assert!(findings.requests_without_txn.is_empty());
    assert!(findings.pending_requests.is_empty());
    assert_eq!(findings.global_sum, 0);
}

/// A registration saying OK whose transaction is missing, one saying OK without txn id, and
/// a committed PENDING registration.
#[tokio::test]
async fn broken_registrations() {
    let mut db = TestDb::new("r_requests").await;
    traffic(&mut db).await;
    db.client
        .batch_execute(
            "INSERT INTO idem_request (client_id, idem_key, request_hash, outcome, txn_id, balance_after) VALUES \
               ('app-z', 'z-2', 'h', 'OK', 999999, 10), \
               ('app-z', 'z-1', 'h', 'OK', NULL, 10), \
               ('app-z', 'z-3', 'h', 'PENDING', NULL, NULL), \
               ('app-y', 'y-1', 'h', 'INSUFFICIENT', NULL, 0)",
        )
        .await
        .unwrap();
    let findings = reconcile(&mut db.client).await.unwrap();
    assert_eq!(
        findings.requests_without_txn,
        vec![
            RequestRef {
                client_id: "app-z".into(),
                idem_key: "z-1".into(),
                outcome: "OK".into(),
                txn_id: None
            },
            RequestRef {
                client_id: "app-z".into(),
                idem_key: "z-2".into(),
                outcome: "OK".into(),
                txn_id: Some(999999)
            },
        ]
    );
    assert_eq!(
        findings.pending_requests,
        vec![RequestRef {
            client_id: "app-z".into(),
            idem_key: "z-3".into(),
            outcome: "PENDING".into(),
            txn_id: None
        }]
    );
    assert!(findings.balance_mismatches.is_empty());
    assert!(findings.unbalanced_txns.is_empty());
    assert!(findings.txns_without_request.is_empty());
    assert_eq!(findings.count(), 3);
    assert_eq!(
        findings.summary(),
        "balance_mismatches=0 unbalanced_txns=0 requests_without_txn=2 \
         txns_without_request=0 pending_requests=1 global_sum=0"
    );

    // A committed PENDING registration is not replayed as a result.
    let err = debit(&mut db.client, "app-z", "z-3", "acct-0001", 1)
        .await
        .unwrap_err();
    assert!(
        matches!(err, points_ledger::LedgerError::KeyReused { .. }),
        "hash 'h' differs: {err:?}"
    );
}

/// A debit made by the caller's own strategy (here: SELECT … FOR UPDATE, check in the
/// application, then an absolute UPDATE) and recorded with `record_transfer` in the same
/// transaction reconciles clean; the same debit without it is found (stored balance
/// disagrees with the entries).
#[tokio::test]
async fn own_strategy_recorded_the_ledgers_way_reconciles_clean() {
    let mut db = TestDb::new("r_record").await;
    grant(&mut db.client, "ops", "g-1", "acct-0003", 100)
        .await
        .unwrap();
    let own_debit =
        |key: &'static str| points_ledger::TransferRequest::debit("app-own", key, "acct-0003", 30);
    for (key, record) in [("k-own-1", true), ("k-own-2", false)] {
        let tx = db.client.transaction().await.unwrap();
        let balance: i64 = tx
            .query_one(
                "SELECT balance FROM account WHERE account_id = 'acct-0003' FOR UPDATE",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(balance >= 30);
        tx.execute(
            "UPDATE account SET balance = $1 WHERE account_id = 'acct-0003'",
            &[&(balance - 30)],
        )
        .await
        .unwrap();
        if record {
            let txn_id = points_ledger::record_transfer(&tx, &own_debit(key), balance - 30)
                .await
                .unwrap();
            assert!(txn_id > 0);
            assert!(matches!(
                points_ledger::record_transfer(&tx, &own_debit(key), balance - 30).await,
                Err(points_ledger::LedgerError::KeyReused { .. })
            ));
        }
        tx.commit().await.unwrap();
        let findings = reconcile(&mut db.client).await.unwrap();
        assert_eq!(findings.is_clean(), record, "{key}: {findings:?}");
    }
}

/// Tombstones left by the retention sweep reconcile clean (their transactions still have
/// a request record), and answer `KeyExpired` instead of executing again; a tombstone
/// whose txn id names no transaction is a finding.
#[tokio::test]
async fn tombstones_reconcile_clean() {
    let mut db = TestDb::new("r_tombstones").await;
    traffic(&mut db).await;
    let swept = points_ledger::retention::sweep(&db.client, 0)
        .await
        .unwrap();
    assert_eq!(swept, 5, "every committed record of the traffic expired");
    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{}", findings.summary());
    let again = points_ledger::retention::sweep(&db.client, 0)
        .await
        .unwrap();
    assert_eq!(again, 0, "a tombstone is not swept twice");
    let err = debit(&mut db.client, "app-a", "k-1", "acct-0001", 300)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            points_ledger::LedgerError::KeyExpired {
                txn_id: Some(_),
                tombstone: true
            }
        ),
        "{err:?}"
    );
    db.client
        .batch_execute(
            "INSERT INTO idem_request (client_id, idem_key, request_hash, outcome, txn_id, expired_at) \
             VALUES ('app-z', 'z-1', 'h', 'EXPIRED', 999999, now())",
        )
        .await
        .unwrap();
    let findings = reconcile(&mut db.client).await.unwrap();
    assert_eq!(
        findings.requests_without_txn,
        vec![RequestRef {
            client_id: "app-z".into(),
            idem_key: "z-1".into(),
            outcome: "EXPIRED".into(),
            txn_id: Some(999999)
        }]
    );
}
