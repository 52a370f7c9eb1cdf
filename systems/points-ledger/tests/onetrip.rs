//! The one-trip transfer (`points_ledger::onetrip`) against the statement transfer: one
//! script of requests run in both modes on two fresh databases gives the same results and
//! the same rows; plus the cases that only the one-trip mode has (its hook point, its
//! isolation check, its own SQLSTATEs) and the races that must behave the same.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use points_ledger::{
    HookAbort, HookContext, HookPoint, Hooks, LedgerError, NoHooks, Outcome, TransferMode,
    TransferRequest, reconcile, transfer_in, transfer_onetrip,
};
use tokio_postgres::Client;

use common::TestDb;

/// One step of the script: a request, or SQL run between requests.
enum Step {
    Do(TransferRequest),
    Sql(&'static str),
}

fn script() -> Vec<Step> {
    use Step::{Do, Sql};
    let debit = TransferRequest::debit;
    let grant = TransferRequest::grant;
    vec![
        Do(grant("app-a", "g-1", "acct-0001", 1000)),
        Do(debit("app-a", "k-1", "acct-0001", 300)),
        // A business reference: stored with the transaction, part of the fingerprint.
        Do(debit("app-a", "k-o", "acct-0001", 10).with_order("ord-1")),
        Do(debit("app-a", "k-o", "acct-0001", 10).with_order("ord-1")),
        Do(debit("app-a", "k-o", "acct-0001", 10).with_order("ord-2")),
        Do(debit("app-a", "k-o", "acct-0001", 10)),
        // Replay, and the same key with other payloads.
        Do(debit("app-a", "k-1", "acct-0001", 300)),
        Do(debit("app-a", "k-1", "acct-0001", 301)),
        Do(debit("app-a", "k-1", "acct-0002", 300)),
        // Another client, same key string.
        Do(debit("app-b", "k-1", "acct-0001", 300)),
        // INSUFFICIENT recorded and replayed, also after a grant.
        Do(debit("app-a", "k-2", "acct-0002", 1)),
        Do(grant("app-a", "g-2", "acct-0002", 10)),
        Do(debit("app-a", "k-2", "acct-0002", 1)),
        Do(debit("app-a", "k-3", "acct-0002", 1)),
        Do(debit("app-a", "k-4", "acct-0002", 10)),
        // NO_ACCOUNT recorded and replayed.
        Do(debit("app-a", "k-5", "acct-9999", 5)),
        Do(debit("app-a", "k-5", "acct-9999", 5)),
        // Invalid amounts, before the database.
        Do(debit("app-a", "k-6", "acct-0001", 0)),
        Do(debit("app-a", "k-6", "acct-0001", -5)),
        // A missing credit account: all rolled back, the key stays free.
        Do(TransferRequest {
            to: "acct-nowhere".into(),
            ..debit("app-a", "k-7", "acct-0001", 5)
        }),
        Do(debit("app-a", "k-7", "acct-0001", 5)),
        // Our own arithmetic out of range, on the credit and on the issuer's debit.
        Sql("UPDATE account SET balance = 9223372036854775807 - 10 WHERE account_id = 'acct-0003'"),
        Do(grant("app-a", "g-over", "acct-0003", 100)),
        Sql(
            "UPDATE account SET balance = balance - (9223372036854775807 - 5000) \
             WHERE account_id = 'sys-issuer'",
        ),
        Do(grant("app-a", "g-under", "acct-0004", 6000)),
        Sql(
            "UPDATE account SET balance = balance + (9223372036854775807 - 5000) \
             WHERE account_id = 'sys-issuer'",
        ),
        // A frozen account: refused, nothing recorded.
        Sql("INSERT INTO account_freeze (account_id, repair_id) VALUES ('acct-0005', 1)"),
        Do(debit("app-a", "k-8", "acct-0005", 1)),
        Sql("DELETE FROM account_freeze"),
        Do(debit("app-a", "k-8", "acct-0005", 1)),
        // A removed record whose transaction exists: expired, never executed again.
        Sql("DELETE FROM idem_request WHERE client_id = 'app-a' AND idem_key = 'k-3'"),
        Do(debit("app-a", "k-3", "acct-0002", 1)),
        Do(debit("app-a", "k-3", "acct-0002", 2)),
        // A tombstone.
        Sql(
            "UPDATE idem_request SET outcome = 'EXPIRED', balance_after = NULL, \
             expired_at = now() WHERE client_id = 'app-a' AND idem_key = 'k-4'",
        ),
        Do(debit("app-a", "k-4", "acct-0002", 10)),
        Do(debit("app-a", "k-4", "acct-0002", 11)),
        // A trigger's own 22003 stays a database error.
        Sql(
            "CREATE FUNCTION t_22003() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             RAISE EXCEPTION 'audit' USING ERRCODE = 'numeric_value_out_of_range'; END $$; \
             CREATE TRIGGER t_22003 BEFORE INSERT ON ledger_entry FOR EACH ROW \
             WHEN (NEW.account_id = 'acct-0006') EXECUTE FUNCTION t_22003()",
        ),
        Do(grant("app-a", "g-trig", "acct-0006", 5)),
        // The CHECK as the last line.
        Sql("ALTER TABLE account DROP CONSTRAINT balance_non_negative; \
             ALTER TABLE account ADD CONSTRAINT balance_non_negative \
             CHECK (allow_negative OR balance >= 0 OR account_id <> 'acct-0007')"),
        Do(debit("app-a", "k-9", "acct-0001", 1)),
    ]
}

/// A result as compared between the modes: the error's variant and fields (txn ids are
/// the same in both databases: the same sequence of statements draws the same numbers).
fn shown(result: &Result<points_ledger::TransferResult, LedgerError>) -> String {
    match result {
        Ok(done) => format!("{done:?}"),
        // A batch of one fails as a whole with the statement's SQLSTATE.
        Err(LedgerError::Db { code, .. } | LedgerError::BatchFailed { code, .. }) => {
            format!("Db({code:?})")
        }
        Err(other) => format!("{other:?}"),
    }
}

/// Every row of the ledger's tables that both modes must write alike.
async fn rows(client: &Client) -> Vec<String> {
    let mut out = Vec::new();
    for sql in [
        "SELECT account_id, allow_negative, balance FROM account ORDER BY account_id",
        "SELECT client_id, idem_key, request_hash, outcome, txn_id, balance_after, \
         expired_at IS NOT NULL FROM idem_request ORDER BY client_id, idem_key",
        "SELECT txn_id, client_id, idem_key, kind, order_id FROM ledger_txn ORDER BY txn_id",
        "SELECT entry_id, txn_id, account_id, amount FROM ledger_entry ORDER BY entry_id",
    ] {
        for row in client.simple_query(sql).await.unwrap() {
            if let tokio_postgres::SimpleQueryMessage::Row(row) = row {
                let values: Vec<&str> = (0..row.len())
                    .map(|i| row.get(i).unwrap_or("NULL"))
                    .collect();
                out.push(values.join("|"));
            }
        }
    }
    out
}

async fn run_script(db: &mut TestDb, mode: TransferMode) -> (Vec<String>, Vec<String>) {
    let mut results = Vec::new();
    for step in script() {
        match step {
            Step::Do(req) => {
                let result = transfer_in(mode, &mut db.client, &req, &NoHooks).await;
                results.push(format!(
                    "{} {}: {}",
                    req.idem_key,
                    req.amount,
                    shown(&result)
                ));
            }
            Step::Sql(sql) => db.client.batch_execute(sql).await.unwrap(),
        }
    }
    (results, rows(&db.client).await)
}

/// The same script in every mode (the batch mode's batches of one): the same results, and
/// the same rows in every table.
#[tokio::test]
async fn both_modes_give_the_same_results_and_rows() {
    let mut statements = TestDb::new("o_same_statements").await;
    let mut onetrip = TestDb::new("o_same_onetrip").await;
    let (results_a, rows_a) = run_script(&mut statements, TransferMode::Statements).await;
    let (results_b, rows_b) = run_script(&mut onetrip, TransferMode::OneTrip).await;
    assert_eq!(results_a, results_b);
    assert_eq!(rows_a, rows_b);
    let mut batch = TestDb::new("o_same_batch").await;
    let (results_c, rows_c) = run_script(&mut batch, TransferMode::Batch).await;
    assert_eq!(results_a, results_c);
    assert_eq!(rows_a, rows_c);
    // The script reached each path it means to.
    let all = results_a.join("\n");
    for expected in [
        "replayed: true",
        "k-o 10: KeyReused",
        "KeyReused",
        "Insufficient",
        "NoAccount",
        "InvalidAmount",
        "CreditAccountMissing",
        "OutOfRange { account: \"acct-0003\"",
        "OutOfRange { account: \"sys-issuer\"",
        "AccountFrozen",
        "KeyExpired { txn_id: Some(",
        "tombstone: true",
        "Db(Some(\"22003\"))",
    ] {
        assert!(all.contains(expected), "{expected} missing from\n{all}");
    }
}

/// Records each hook point passed.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(HookPoint, bool)>>,
    abort_after_commit: bool,
}

impl Hooks for Recorder {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        self.seen
            .lock()
            .unwrap()
            .push((ctx.point, ctx.transaction.is_some()));
        let abort = self.abort_after_commit;
        Box::pin(async move {
            if abort {
                Err(HookAbort::new("test"))
            } else {
                Ok(())
            }
        })
    }
}

/// Only `after-commit` exists in the one-trip mode: passed once on every committing path,
/// never on a replay; aborting there leaves the transfer committed (a lost response).
#[tokio::test]
async fn only_after_commit_is_a_hook_point() {
    let mut db = TestDb::new("o_hooks").await;
    let c = &mut db.client;
    let recorder = Recorder::default();
    let grant = TransferRequest::grant("app-a", "g-1", "acct-0001", 10);
    transfer_onetrip(c, &grant, &recorder).await.unwrap();
    let refused = TransferRequest::debit("app-a", "k-1", "acct-0001", 11);
    let done = transfer_onetrip(c, &refused, &recorder).await.unwrap();
    assert_eq!(done.outcome, Outcome::Insufficient);
    transfer_onetrip(c, &refused, &recorder).await.unwrap();
    assert_eq!(
        *recorder.seen.lock().unwrap(),
        vec![
            (HookPoint::AfterCommit, false),
            (HookPoint::AfterCommit, false)
        ]
    );
    let lost = Recorder {
        abort_after_commit: true,
        ..Recorder::default()
    };
    let req = TransferRequest::debit("app-a", "k-2", "acct-0001", 4);
    assert!(matches!(
        transfer_onetrip(c, &req, &lost).await,
        Err(LedgerError::HookAborted(HookPoint::AfterCommit))
    ));
    let retry = transfer_onetrip(c, &req, &NoHooks).await.unwrap();
    assert_eq!(
        (retry.outcome, retry.balance, retry.replayed),
        (Outcome::Ok, 6, true)
    );
}

/// The function refuses any isolation level but READ COMMITTED, and nothing is recorded.
#[tokio::test]
async fn refuses_other_isolation_levels() {
    let db = TestDb::new("o_isolation").await;
    db.client
        .batch_execute("SET default_transaction_isolation = 'repeatable read'")
        .await
        .unwrap();
    let req = TransferRequest::grant("app-a", "g-1", "acct-0001", 10);
    let error = transfer_onetrip(&db.client, &req, &NoHooks)
        .await
        .unwrap_err();
    assert_eq!(
        error.sqlstate(),
        Some(points_ledger::onetrip::SQLSTATE_NOT_READ_COMMITTED)
    );
    db.client
        .batch_execute("RESET default_transaction_isolation")
        .await
        .unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM idem_request").await, 0);
    assert!(transfer_onetrip(&db.client, &req, &NoHooks).await.is_ok());
}

/// A same-key request waits on the unique index while the first one's transaction is
/// open, then replays what it committed (SPEC §3 step 1), in the one-trip mode too.
#[tokio::test]
async fn same_key_waits_for_the_open_holder_then_replays() {
    let mut db = TestDb::new("o_same_key").await;
    transfer_in(
        TransferMode::OneTrip,
        &mut db.client,
        &TransferRequest::grant("app-a", "g-1", "acct-0001", 100),
        &NoHooks,
    )
    .await
    .unwrap();
    // The holder: the same function, called inside a transaction left open.
    let mut holder = db.connect().await;
    let tx = holder.transaction().await.unwrap();
    let req = TransferRequest::debit("app-a", "k-1", "acct-0001", 30);
    let first = tx
        .query_one(
            "SELECT txn_id, balance_after FROM ledger_transfer_onetrip($1, $2, $3, $4, $5, $6, $7)",
            &[
                &req.client_id,
                &req.idem_key,
                &req.request_hash(),
                &req.kind.as_str(),
                &req.from,
                &req.to,
                &req.amount,
            ],
        )
        .await
        .unwrap();
    let (first_txn, first_balance): (Option<i64>, Option<i64>) = (first.get(0), first.get(1));
    assert_eq!(first_balance, Some(70));
    let waiter_client = db.connect().await;
    let waiter_pid: i32 = waiter_client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let waiter = tokio::spawn({
        let req = req.clone();
        async move { transfer_onetrip(&waiter_client, &req, &NoHooks).await }
    });
    // Wait until the server says the waiter is blocked by the holder.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let blocked: i64 = db
            .client
            .query_one(
                "SELECT cardinality(pg_blocking_pids($1))::bigint",
                &[&waiter_pid],
            )
            .await
            .unwrap()
            .get(0);
        if blocked > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never blocked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tx.commit().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(
        (
            second.outcome,
            second.txn_id,
            second.balance,
            second.replayed
        ),
        (Outcome::Ok, first_txn, 70, true)
    );
    assert_eq!(db.balance("acct-0001").await, 70);
}

/// 32 concurrent one-trip debits of 7 from 100: exactly floor(100/7) succeed, the balance
/// never goes below 0, and the ledger reconciles (L3 in the one-trip mode).
#[tokio::test]
async fn concurrent_onetrip_debits_never_overdraw() {
    let mut db = TestDb::new("o_concurrent").await;
    transfer_onetrip(
        &db.client,
        &TransferRequest::grant("app-a", "g-1", "acct-0001", 100),
        &NoHooks,
    )
    .await
    .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let mut tasks = Vec::new();
    for n in 0..32 {
        let client = db.connect().await;
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let req = TransferRequest::debit("app-a", format!("k-{n}"), "acct-0001", 7);
            transfer_onetrip(&client, &req, &NoHooks).await.unwrap()
        }));
    }
    let mut ok = 0;
    for task in tasks {
        if task.await.unwrap().outcome == Outcome::Ok {
            ok += 1;
        }
    }
    assert_eq!(ok, 100 / 7);
    assert_eq!(db.balance("acct-0001").await, 100 % 7);
    assert!(reconcile(&mut db.client).await.unwrap().is_clean());
}
