//! Integration tests of `transfer` against a real PostgreSQL 16 (scratch cluster).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, join_all};
use points_ledger::{
    HookAbort, HookContext, HookPoint, Hooks, LedgerError, NoHooks, Outcome, SYS_ISSUER,
    SYS_REDEEM, TransferRequest, debit, grant, reconcile, transfer,
};
use tokio::sync::{Notify, oneshot};

use common::TestDb;

/// L1-like: grant 1000, debit 300 → 700; the debit's transaction has two entries summing to
/// 0; the registrations say OK with the right txn id and reported balance.
#[tokio::test]
async fn normal_path_grant_then_debit() {
    let mut db = TestDb::new("t_normal_path").await;

    let granted = grant(&mut db.client, "app-a", "g-0101", "acct-0001", 1000)
        .await
        .unwrap();
    assert_eq!(granted.outcome, Outcome::Ok);
    assert_eq!(granted.balance, 1000);
    assert!(!granted.replayed);
    let grant_txn = granted.txn_id.expect("grant txn id");

    let debited = debit(&mut db.client, "app-a", "k-0101", "acct-0001", 300)
        .await
        .unwrap();
    assert_eq!(debited.outcome, Outcome::Ok);
    assert_eq!(debited.balance, 700);
    assert!(!debited.replayed);
    let debit_txn = debited.txn_id.expect("debit txn id");
    assert_ne!(grant_txn, debit_txn);

    assert_eq!(db.balance("acct-0001").await, 700);
    assert_eq!(db.balance(SYS_ISSUER).await, -1000);
    assert_eq!(db.balance(SYS_REDEEM).await, 300);

    let entries: Vec<(String, i64)> = db
        .client
        .query(
            "SELECT account_id, amount FROM ledger_entry WHERE txn_id = $1 ORDER BY entry_id",
            &[&debit_txn],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        entries,
        vec![("acct-0001".to_owned(), -300), (SYS_REDEEM.to_owned(), 300)]
    );
    assert_eq!(entries.iter().map(|e| e.1).sum::<i64>(), 0);

    let txn = db
        .client
        .query_one(
            "SELECT client_id, idem_key, kind FROM ledger_txn WHERE txn_id = $1",
            &[&debit_txn],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            txn.get::<_, &str>(0),
            txn.get::<_, &str>(1),
            txn.get::<_, &str>(2)
        ),
        ("app-a", "k-0101", "DEBIT")
    );

    /// idem_key, request_hash, outcome, txn_id, balance_after.
    type RequestRow = (String, String, String, Option<i64>, Option<i64>);
    let rows: Vec<RequestRow> = db
        .client
        .query(
            "SELECT idem_key, request_hash, outcome, txn_id, balance_after \
             FROM idem_request ORDER BY idem_key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    assert_eq!(
        rows,
        vec![
            (
                "g-0101".to_owned(),
                TransferRequest::grant("app-a", "g-0101", "acct-0001", 1000).request_hash(),
                "OK".to_owned(),
                Some(grant_txn),
                Some(1000)
            ),
            (
                "k-0101".to_owned(),
                "71ee59fc88147037d30c4e785127a745".to_owned(),
                "OK".to_owned(),
                Some(debit_txn),
                Some(700)
            ),
        ]
    );

    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
}

/// Replays, key reuse with another payload, INSUFFICIENT and NO_ACCOUNT recorded and
/// replayed, client ids scoping keys, and requests rejected before execution.
#[tokio::test]
async fn replay_and_rejections() {
    let mut db = TestDb::new("t_replay").await;
    let c = &mut db.client;

    grant(c, "app-a", "g-1", "acct-0001", 1000).await.unwrap();
    let first = debit(c, "app-a", "k-1", "acct-0001", 300).await.unwrap();
    let again = debit(c, "app-a", "k-1", "acct-0001", 300).await.unwrap();
    assert!(again.replayed);
    assert_eq!(
        (again.outcome, again.txn_id, again.balance),
        (first.outcome, first.txn_id, first.balance)
    );

    // Same key, other amount: rejected, nothing recorded.
    match debit(c, "app-a", "k-1", "acct-0001", 301).await {
        Err(LedgerError::KeyReused {
            stored_hash,
            request_hash,
        }) => {
            assert_eq!(
                stored_hash,
                TransferRequest::debit("app-a", "k-1", "acct-0001", 300).request_hash()
            );
            assert_eq!(
                request_hash,
                TransferRequest::debit("app-a", "k-1", "acct-0001", 301).request_hash()
            );
        }
        other => panic!("expected KeyReused, got {other:?}"),
    }
    // Same key, same amount, another account: also another payload.
    assert!(matches!(
        debit(c, "app-a", "k-1", "acct-0002", 300).await,
        Err(LedgerError::KeyReused { .. })
    ));

    // Another client id with the same key string is an independent request.
    let other_client = debit(c, "app-b", "k-1", "acct-0001", 300).await.unwrap();
    assert!(!other_client.replayed);
    assert_eq!(other_client.balance, 400);
    assert_ne!(other_client.txn_id, first.txn_id);

    // INSUFFICIENT is recorded and stays the answer for that key (L2).
    let refused = debit(c, "app-a", "k-2", "acct-0002", 1).await.unwrap();
    assert_eq!(
        (
            refused.outcome,
            refused.txn_id,
            refused.balance,
            refused.replayed
        ),
        (Outcome::Insufficient, None, 0, false)
    );
    grant(c, "app-a", "g-2", "acct-0002", 10).await.unwrap();
    let refused_again = debit(c, "app-a", "k-2", "acct-0002", 1).await.unwrap();
    assert_eq!(
        (
            refused_again.outcome,
            refused_again.txn_id,
            refused_again.balance,
            refused_again.replayed
        ),
        (Outcome::Insufficient, None, 0, true)
    );
    let fresh = debit(c, "app-a", "k-3", "acct-0002", 1).await.unwrap();
    assert_eq!((fresh.outcome, fresh.balance), (Outcome::Ok, 9));

    // INSUFFICIENT reports the current balance.
    let short = debit(c, "app-a", "k-4", "acct-0002", 10).await.unwrap();
    assert_eq!((short.outcome, short.balance), (Outcome::Insufficient, 9));

    // NO_ACCOUNT is recorded and replayed.
    let missing = debit(c, "app-a", "k-5", "acct-9999", 5).await.unwrap();
    assert_eq!(
        (
            missing.outcome,
            missing.txn_id,
            missing.balance,
            missing.replayed
        ),
        (Outcome::NoAccount, None, 0, false)
    );
    let missing_again = debit(c, "app-a", "k-5", "acct-9999", 5).await.unwrap();
    assert_eq!(
        (missing_again.outcome, missing_again.replayed),
        (Outcome::NoAccount, true)
    );

    let outcomes: Vec<(String, String, Option<i64>, Option<i64>)> = c
        .query(
            "SELECT idem_key, outcome, txn_id, balance_after FROM idem_request \
             WHERE client_id = 'app-a' AND idem_key IN ('k-2', 'k-4', 'k-5') ORDER BY idem_key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(
        outcomes,
        vec![
            ("k-2".into(), "INSUFFICIENT".into(), None, Some(0)),
            ("k-4".into(), "INSUFFICIENT".into(), None, Some(9)),
            ("k-5".into(), "NO_ACCOUNT".into(), None, Some(0)),
        ]
    );

    // Rejected before the database: nothing recorded.
    assert!(matches!(
        debit(c, "app-a", "k-6", "acct-0001", 0).await,
        Err(LedgerError::InvalidAmount(0))
    ));
    assert!(matches!(
        debit(c, "app-a", "k-6", "acct-0001", -5).await,
        Err(LedgerError::InvalidAmount(-5))
    ));

    // A missing credit account rolls everything back, including the registration.
    let to_nowhere = TransferRequest {
        to: "acct-nowhere".into(),
        ..TransferRequest::debit("app-a", "k-7", "acct-0001", 5)
    };
    match transfer(c, &to_nowhere, &NoHooks).await {
        Err(LedgerError::CreditAccountMissing(account)) => assert_eq!(account, "acct-nowhere"),
        other => panic!("expected CreditAccountMissing, got {other:?}"),
    }
    assert_eq!(db.balance("acct-0001").await, 400);
    assert_eq!(
        db.scalar("SELECT count(*) FROM idem_request WHERE idem_key IN ('k-6', 'k-7')")
            .await,
        0
    );

    // Exactly one transaction per key.
    assert_eq!(
        db.scalar("SELECT count(*) FROM ledger_txn WHERE client_id = 'app-a' AND idem_key = 'k-1'")
            .await,
        1
    );
    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
}

/// The CHECK is the last line: a direct overdraft is refused with SQLSTATE 23514, and the
/// error shows the SQLSTATE and the server's message.
#[tokio::test]
async fn check_violation_keeps_sqlstate() {
    let db = TestDb::new("t_check").await;
    let err = db
        .client
        .execute(
            "UPDATE account SET balance = balance - 1 WHERE account_id = 'acct-0001'",
            &[],
        )
        .await
        .unwrap_err();
    let err = LedgerError::from(err);
    assert_eq!(err.sqlstate(), Some("23514"));
    let text = err.to_string();
    assert!(text.contains("23514"), "{text}");
    assert!(text.contains("balance_non_negative"), "{text}");
}

/// Records the points passed and, through the open transaction, what it sees there.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(HookPoint, bool, i64)>>,
    abort_at: Option<HookPoint>,
}

impl Hooks for Recorder {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        Box::pin(async move {
            // Entries of this key visible inside the transaction (0 outside it).
            let entries = match ctx.transaction {
                Some(tx) => tx
                    .query_one(
                        "SELECT count(*) FROM ledger_entry e JOIN ledger_txn t USING (txn_id) \
                         WHERE t.client_id = $1 AND t.idem_key = $2",
                        &[&ctx.request.client_id, &ctx.request.idem_key],
                    )
                    .await
                    .map_err(|e| HookAbort::new(e.to_string()))?
                    .get(0),
                None => -1,
            };
            self.seen
                .lock()
                .unwrap()
                .push((ctx.point, ctx.transaction.is_some(), entries));
            if self.abort_at == Some(ctx.point) {
                return Err(HookAbort::new("test abort"));
            }
            Ok(())
        })
    }
}

#[tokio::test]
async fn hooks_run_in_order_and_abort() {
    let mut db = TestDb::new("t_hooks").await;
    grant(&mut db.client, "app-a", "g-1", "acct-0001", 100)
        .await
        .unwrap();

    let recorder = Recorder::default();
    let req = TransferRequest::debit("app-a", "k-1", "acct-0001", 40);
    let done = transfer(&mut db.client, &req, &recorder).await.unwrap();
    assert_eq!((done.outcome, done.balance), (Outcome::Ok, 60));
    assert_eq!(
        *recorder.seen.lock().unwrap(),
        vec![
            (HookPoint::Registered, true, 0),
            (HookPoint::EntriesWritten, true, 2),
            (HookPoint::BeforeCommit, true, 2),
            (HookPoint::AfterCommit, false, -1),
        ]
    );

    // A replay runs no hooks.
    let recorder = Recorder::default();
    assert!(
        transfer(&mut db.client, &req, &recorder)
            .await
            .unwrap()
            .replayed
    );
    assert!(recorder.seen.lock().unwrap().is_empty());

    // A refusal commits, so it passes registered, before-commit and after-commit.
    let recorder = Recorder::default();
    let refused = TransferRequest::debit("app-a", "k-2", "acct-0001", 1000);
    let result = transfer(&mut db.client, &refused, &recorder).await.unwrap();
    assert_eq!(result.outcome, Outcome::Insufficient);
    let points: Vec<HookPoint> = recorder.seen.lock().unwrap().iter().map(|s| s.0).collect();
    assert_eq!(
        points,
        vec![
            HookPoint::Registered,
            HookPoint::BeforeCommit,
            HookPoint::AfterCommit
        ]
    );

    // Aborts before commit roll everything back; the key is then free.
    let mut expected = 60;
    for (n, point) in [
        HookPoint::Registered,
        HookPoint::EntriesWritten,
        HookPoint::BeforeCommit,
    ]
    .into_iter()
    .enumerate()
    {
        let recorder = Recorder {
            abort_at: Some(point),
            ..Recorder::default()
        };
        let req = TransferRequest::debit("app-a", format!("k-abort-{n}"), "acct-0001", 5);
        match transfer(&mut db.client, &req, &recorder).await {
            Err(LedgerError::HookAborted(p)) => assert_eq!(p, point),
            other => panic!("expected HookAborted({point}), got {other:?}"),
        }
        assert_eq!(db.balance("acct-0001").await, expected);
        let fresh = transfer(&mut db.client, &req, &NoHooks).await.unwrap();
        expected -= 5;
        assert_eq!((fresh.replayed, fresh.balance), (false, expected));
    }
    assert_eq!(db.balance("acct-0001").await, 45);

    // An abort after commit is reported, but the transfer stays committed and replays.
    let recorder = Recorder {
        abort_at: Some(HookPoint::AfterCommit),
        ..Recorder::default()
    };
    let req = TransferRequest::debit("app-a", "k-late", "acct-0001", 5);
    assert!(matches!(
        transfer(&mut db.client, &req, &recorder).await,
        Err(LedgerError::HookAborted(HookPoint::AfterCommit))
    ));
    let replay = transfer(&mut db.client, &req, &NoHooks).await.unwrap();
    assert_eq!((replay.replayed, replay.balance), (true, 40));

    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
}

/// Pauses at one point until released, then aborts or continues.
struct Pause {
    at: HookPoint,
    reached: Notify,
    release: Mutex<Option<oneshot::Receiver<bool>>>,
}

impl Hooks for Pause {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        Box::pin(async move {
            if ctx.point != self.at {
                return Ok(());
            }
            self.reached.notify_one();
            let release = self.release.lock().unwrap().take().expect("paused once");
            match release.await {
                Ok(true) => Ok(()),
                _ => Err(HookAbort::new("released with abort")),
            }
        })
    }
}

/// L9-like in-process: a transfer paused at before-commit holds the key; a same-key request
/// waits on it. When the first rolls back, the waiter runs as the first request (not a
/// replay); when the first commits, the waiter replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_waits_for_the_holder() {
    let mut db = TestDb::new("t_waiter").await;
    grant(&mut db.client, "app-a", "g-1", "acct-0001", 100)
        .await
        .unwrap();

    for commit_first in [false, true] {
        let key = format!("k-wait-{commit_first}");
        let (release_tx, release_rx) = oneshot::channel();
        let pause = Arc::new(Pause {
            at: HookPoint::BeforeCommit,
            reached: Notify::new(),
            release: Mutex::new(Some(release_rx)),
        });
        let mut holder_client = db.connect().await;
        let holder_req = TransferRequest::debit("app-a", key.clone(), "acct-0001", 40);
        let holder = tokio::spawn({
            let pause = pause.clone();
            async move { transfer(&mut holder_client, &holder_req, &*pause).await }
        });
        pause.reached.notified().await;

        // Another session still sees the committed balance.
        let before = db.balance("acct-0001").await;
        let mut waiter_client = db.connect().await;
        let waiter = tokio::spawn({
            let key = key.clone();
            async move { debit(&mut waiter_client, "app-a", &key, "acct-0001", 40).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiter.is_finished(), "the same-key request must wait");

        release_tx.send(commit_first).unwrap();
        let holder = holder.await.unwrap();
        let waiter = waiter.await.unwrap().unwrap();
        if commit_first {
            let holder = holder.unwrap();
            assert!(waiter.replayed);
            assert_eq!(
                (waiter.txn_id, waiter.balance),
                (holder.txn_id, holder.balance)
            );
            assert_eq!(holder.balance, before - 40);
        } else {
            assert!(matches!(
                holder,
                Err(LedgerError::HookAborted(HookPoint::BeforeCommit))
            ));
            assert!(!waiter.replayed);
            assert_eq!((waiter.outcome, waiter.balance), (Outcome::Ok, before - 40));
        }
        assert_eq!(
            db.scalar(&format!(
                "SELECT count(*) FROM ledger_txn WHERE idem_key = '{key}'"
            ))
            .await,
            1
        );
    }
    assert_eq!(db.balance("acct-0001").await, 20);
}

/// L3-like: 32 connections debit 7 from 100 at once → 14 OK, 18 INSUFFICIENT, balance 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_debits_never_overdraw() {
    let mut db = TestDb::new("t_concurrent").await;
    grant(&mut db.client, "app-a", "g-1", "acct-0001", 100)
        .await
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..32 {
        clients.push(db.connect().await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(32));
    let tasks = clients.into_iter().enumerate().map(|(n, mut client)| {
        let start = start.clone();
        tokio::spawn(async move {
            start.wait().await;
            debit(&mut client, "app-a", &format!("k-{n:02}"), "acct-0001", 7).await
        })
    });
    let results: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let ok = results.iter().filter(|r| r.outcome == Outcome::Ok).count();
    let insufficient = results
        .iter()
        .filter(|r| r.outcome == Outcome::Insufficient)
        .count();
    assert_eq!((ok, insufficient), (14, 18));
    assert_eq!(db.balance("acct-0001").await, 2);
    assert_eq!(
        db.scalar("SELECT count(*) FROM ledger_txn WHERE kind = 'DEBIT'")
            .await,
        14
    );
    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
}

/// L8-like: 16 identical same-key requests at once → one execution, 15 replays, one answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_same_moment() {
    let mut db = TestDb::new("t_same_key").await;
    grant(&mut db.client, "app-a", "g-1", "acct-0001", 100)
        .await
        .unwrap();
    let mut clients = Vec::new();
    for _ in 0..16 {
        clients.push(db.connect().await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(16));
    let tasks = clients.into_iter().map(|mut client| {
        let start = start.clone();
        tokio::spawn(async move {
            start.wait().await;
            debit(&mut client, "app-a", "k-0801", "acct-0001", 30).await
        })
    });
    let results: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    let fresh = results.iter().filter(|r| !r.replayed).count();
    assert_eq!(fresh, 1);
    let mut answers: Vec<_> = results
        .iter()
        .map(|r| (r.outcome, r.txn_id, r.balance))
        .collect();
    answers.dedup();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].2, 70);
    assert_eq!(db.balance("acct-0001").await, 70);
}
