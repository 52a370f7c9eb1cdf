//! The batch transfer (`points_ledger::batch`, `points_ledger::batcher`) on a real
//! PostgreSQL: one batch of mixed requests answered each as alone (compared with the
//! statement transfer on a second database), concurrent batches naming the same accounts
//! in opposite orders (no deadlock, every debit once, the ledger reconciles), and the
//! collector's queue, gate and batch sizes.

mod common;

use std::sync::Arc;

use points_ledger::batch::transfer_batch;
use points_ledger::batcher::{self, BatchLimits, Batcher, FixedConnections};
use points_ledger::{
    LedgerError, NoHooks, Outcome, TransferMode, TransferRequest, reconcile, transfer_in,
};

use common::TestDb;

fn shown(result: &Result<points_ledger::TransferResult, LedgerError>) -> String {
    match result {
        Ok(done) => format!("{done:?}"),
        Err(other) => format!("{other:?}"),
    }
}

/// Grants 100 points to acct-0001 and debits 5 from acct-0003 under `k-used`.
fn before() -> Vec<TransferRequest> {
    vec![
        TransferRequest::grant("app", "g-1", "acct-0001", 100),
        TransferRequest::grant("app", "g-3", "acct-0003", 50),
        TransferRequest::debit("app", "k-used", "acct-0003", 5),
    ]
}

/// One batch: an OK, an INSUFFICIENT, the same key twice, a key reused with another
/// amount, an unknown account, an invalid amount, a missing credit account.
fn mixed() -> Vec<TransferRequest> {
    let debit = TransferRequest::debit;
    vec![
        debit("app", "k-ok", "acct-0001", 30),
        debit("app", "k-poor", "acct-0002", 1),
        debit("app", "k-twice", "acct-0001", 20),
        debit("app", "k-twice", "acct-0001", 20),
        debit("app", "k-used", "acct-0003", 6),
        debit("app", "k-nobody", "acct-9999", 5),
        debit("app", "k-zero", "acct-0001", 0),
        TransferRequest {
            to: "acct-nowhere".into(),
            ..debit("app", "k-nocredit", "acct-0001", 1)
        },
        debit("app", "k-ok", "acct-0001", 30),
    ]
}

/// Each request of one real batch gets exactly what it gets alone, one after the other,
/// in the statement mode; the tables hold the same rows.
#[tokio::test]
async fn one_batch_answers_each_request_as_alone() {
    let mut alone = TestDb::new("b_alone").await;
    let mut batched = TestDb::new("b_batched").await;
    for request in before() {
        transfer_in(
            TransferMode::Statements,
            &mut alone.client,
            &request,
            &NoHooks,
        )
        .await
        .unwrap();
        transfer_in(TransferMode::Batch, &mut batched.client, &request, &NoHooks)
            .await
            .unwrap();
    }
    let mut expected = Vec::new();
    for request in mixed() {
        let result = transfer_in(
            TransferMode::Statements,
            &mut alone.client,
            &request,
            &NoHooks,
        )
        .await;
        expected.push(shown(&result));
    }
    let answers = transfer_batch(&mut batched.client, &mixed(), &NoHooks).await;
    let seen: Vec<String> = answers.iter().map(shown).collect();
    assert_eq!(seen, expected);
    assert!(expected[0].contains("outcome: Ok") && expected[1].contains("Insufficient"));
    assert!(expected[3].contains("replayed: true") && expected[4].contains("KeyReused"));
    assert!(expected[5].contains("NoAccount") && expected[8].contains("replayed: true"));
    assert_eq!(counts(&alone).await, counts(&batched).await);
    assert!(reconcile(&mut batched.client).await.unwrap().is_clean());
}

/// The sink is locked last and its balance decided open: a batch whose credits would
/// carry the sink past the bigint maximum fails that bound when the sink is locked, and
/// is decided again with every balance locked (the exact attempt). Each debit still gets
/// what it gets alone: the first OK, the second out of range on the sink; same balances.
#[tokio::test]
async fn a_sink_credited_past_its_bound_is_decided_again_exactly() {
    let mut alone = TestDb::new("b_sink_alone").await;
    let mut batched = TestDb::new("b_sink_batched").await;
    let near_max =
        "UPDATE account SET balance = 9223372036854775797 WHERE account_id = 'sys-redeem'";
    for request in before() {
        transfer_in(
            TransferMode::Statements,
            &mut alone.client,
            &request,
            &NoHooks,
        )
        .await
        .unwrap();
        transfer_in(TransferMode::Batch, &mut batched.client, &request, &NoHooks)
            .await
            .unwrap();
    }
    alone.client.batch_execute(near_max).await.unwrap();
    batched.client.batch_execute(near_max).await.unwrap();
    let requests = vec![
        TransferRequest::debit("app", "k-fits", "acct-0001", 6),
        TransferRequest::debit("app", "k-over", "acct-0003", 6),
    ];
    let mut expected = Vec::new();
    for request in &requests {
        let result = transfer_in(
            TransferMode::Statements,
            &mut alone.client,
            request,
            &NoHooks,
        )
        .await;
        expected.push(shown(&result));
    }
    let answers = transfer_batch(&mut batched.client, &requests, &NoHooks).await;
    let seen: Vec<String> = answers.iter().map(shown).collect();
    assert_eq!(seen, expected);
    assert!(expected[0].contains("outcome: Ok"), "{expected:?}");
    assert!(expected[1].contains("OutOfRange") && expected[1].contains("sys-redeem"));
    let balances =
        "SELECT string_agg(account_id || '=' || balance, ' ' ORDER BY account_id) FROM account";
    let of = |row: tokio_postgres::Row| -> String { row.get(0) };
    assert_eq!(
        of(alone.client.query_one(balances, &[]).await.unwrap()),
        of(batched.client.query_one(balances, &[]).await.unwrap())
    );
    assert_eq!(counts(&alone).await, counts(&batched).await);
}

/// Runs one debit from each of `accounts` as its own batch on its own connection while a
/// third transaction holds the sink (FOR NO KEY UPDATE, as an UPDATE of its balance
/// would); once both batches are seen waiting for a lock (`pg_blocking_pids`), the holder
/// commits. The two answers.
async fn two_batches_meet_at_the_sink(db: &TestDb, accounts: [&str; 2]) -> Vec<String> {
    let mut holder = db.connect().await;
    let hold = holder.transaction().await.unwrap();
    hold.execute(
        "SELECT 1 FROM account WHERE account_id = 'sys-redeem' FOR NO KEY UPDATE",
        &[],
    )
    .await
    .unwrap();
    let mut pids = Vec::new();
    let mut tasks = Vec::new();
    for (n, account) in accounts.into_iter().enumerate() {
        let mut client = db.connect().await;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .unwrap()
            .get(0);
        pids.push(pid);
        let request = TransferRequest::debit("app", format!("k-meet-{n}"), account, 1);
        tasks.push(tokio::spawn(async move {
            transfer_batch(&mut client, &[request], &NoHooks).await
        }));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: i64 = db
            .client
            .query_one(
                "SELECT count(*) FROM unnest($1::int4[]) p WHERE cardinality(pg_blocking_pids(p)) > 0",
                &[&pids],
            )
            .await
            .unwrap()
            .get(0);
        if waiting == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the batches never both waited"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    hold.commit().await.unwrap();
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap().iter().map(shown));
    }
    answers
}

/// Two batches that both wrote their entries (whose foreign-key checks take FOR KEY SHARE
/// on the sink) and then wait to lock the sink both commit: the function locks FOR NO KEY
/// UPDATE. Negative control: the same function locking FOR UPDATE, which conflicts with
/// the other batch's key share, deadlocks them (40P01) in the same steps.
#[tokio::test]
async fn two_batches_waiting_for_the_sink_both_commit() {
    let mut db = TestDb::new("b_meet").await;
    for request in before() {
        transfer_in(TransferMode::Batch, &mut db.client, &request, &NoHooks)
            .await
            .unwrap();
    }
    let answers = two_batches_meet_at_the_sink(&db, ["acct-0001", "acct-0003"]).await;
    assert!(
        answers.iter().all(|a| a.contains("outcome: Ok")),
        "{answers:?}"
    );

    let mut control = TestDb::new("b_meet_for_update").await;
    let for_update =
        points_ledger::schema::BATCH_FUNCTION_SQL.replace("FOR NO KEY UPDATE", "FOR UPDATE");
    assert_ne!(for_update, points_ledger::schema::BATCH_FUNCTION_SQL);
    control.client.batch_execute(&for_update).await.unwrap();
    for request in before() {
        transfer_in(TransferMode::Batch, &mut control.client, &request, &NoHooks)
            .await
            .unwrap();
    }
    let answers = two_batches_meet_at_the_sink(&control, ["acct-0001", "acct-0003"]).await;
    assert!(answers.iter().any(|a| a.contains("40P01")), "{answers:?}");
}

/// Many concurrent batches through two drainers, every batch naming the same accounts in
/// arrival orders that differ: no deadlock, each key executed once, the ledger clean.
/// The two requests of a key credit different redemption stripes, so they queue in
/// different lanes (`batcher::lane_of`): each drainer's batches name every account, and
/// one key is in both drainers' batches.
#[tokio::test]
async fn concurrent_batches_never_deadlock_and_execute_each_key_once() {
    let db = TestDb::new("b_concurrent").await;
    points_ledger::striping::create_redeem_stripes(&db.client, 2)
        .await
        .unwrap();
    for n in 1..=10 {
        let grant = TransferRequest::grant(
            "app",
            format!("g-{n}"),
            points_ledger::test_account(n),
            1_000,
        );
        points_ledger::transfer(&mut db.connect().await, &grant, &NoHooks)
            .await
            .unwrap();
    }
    let clients = vec![db.connect().await, db.connect().await];
    let batcher = Arc::new(Batcher::start(
        Box::new(FixedConnections::new(clients)),
        Arc::new(NoHooks),
        BatchLimits {
            max_requests: 16,
            drainers: 2,
        },
    ));
    let mut tasks = Vec::new();
    for n in 0..400u32 {
        let batcher = batcher.clone();
        // Odd tasks walk the accounts upwards, even ones downwards; each key twice.
        let account = if n % 2 == 0 {
            1 + (n / 2) % 10
        } else {
            10 - (n / 2) % 10
        };
        let request = TransferRequest::debit_into(
            "app",
            format!("k-{}", n / 2),
            points_ledger::test_account(account),
            points_ledger::striping::redeem_stripe(n % 2),
            1,
        );
        assert_eq!(batcher::lane_of(&request, 2), (n % 2) as usize);
        tasks.push(tokio::spawn(async move { batcher.submit(request).await }));
    }
    let mut executed = 0;
    let mut replayed = 0;
    for task in tasks {
        let result = task.await.unwrap();
        match result {
            Ok(done) if done.replayed => replayed += 1,
            Ok(done) => {
                assert_eq!(done.outcome, Outcome::Ok);
                executed += 1
            }
            Err(LedgerError::KeyReused { .. }) => {}
            Err(other) => panic!("{other}"),
        }
    }
    // Keys k-0…k-199: requests 2i and 2i+1 share key k-i but name different accounts, so
    // whichever runs second is KEY_REUSED (in the same batch it waits for the first).
    assert_eq!((executed, replayed), (200, 0));
    assert_eq!(batcher.sizes().requests(), 400);
    let row = db
        .client
        .query_one("SELECT count(*) FROM ledger_txn WHERE kind = 'DEBIT'", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 200);
    assert!(reconcile(&mut db.connect().await).await.unwrap().is_clean());
}

/// A held queue takes nothing; released, a drainer takes all of it as one batch.
#[tokio::test]
async fn a_held_queue_is_released_as_one_batch() {
    let db = TestDb::new("b_held").await;
    let grant = TransferRequest::grant("app", "g", "acct-0001", 100);
    points_ledger::transfer(&mut db.connect().await, &grant, &NoHooks)
        .await
        .unwrap();
    let batcher = Arc::new(Batcher::start(
        Box::new(FixedConnections::new(vec![db.connect().await])),
        Arc::new(NoHooks),
        BatchLimits {
            max_requests: 64,
            drainers: 1,
        },
    ));
    batcher.hold(true);
    let mut tasks = Vec::new();
    for n in 0..5 {
        let batcher = batcher.clone();
        let request = TransferRequest::debit("app", format!("h-{n}"), "acct-0001", 30);
        tasks.push(tokio::spawn(async move { batcher.submit(request).await }));
    }
    while batcher.queued() < 5 {
        tokio::task::yield_now().await;
    }
    assert_eq!(batcher.sizes().batches(), 0);
    batcher.hold(false);
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap().unwrap().outcome);
    }
    assert_eq!(outcomes.iter().filter(|o| **o == Outcome::Ok).count(), 3);
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == Outcome::Insufficient)
            .count(),
        2
    );
    let sizes = batcher.sizes();
    assert_eq!((sizes.batches(), sizes.counts[5]), (1, 1));
}

/// Transactions, key records, and acct-0001's balance.
async fn counts(db: &TestDb) -> (i64, i64, i64) {
    let row = db
        .client
        .query_one(
            "SELECT (SELECT count(*) FROM ledger_txn), (SELECT count(*) FROM idem_request), \
             (SELECT balance FROM account WHERE account_id = 'acct-0001')",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// Calls `ledger_transfer_batch` directly with debits of 1 point, one per `(key, from)`
/// (client `app`), in one transaction that is rolled back; returns the SQLSTATE of its
/// error, or `None` when it answered.
async fn raw_batch_error(db: &mut TestDb, requests: &[(&str, &str)]) -> Option<String> {
    let n = requests.len();
    let text = |value: &str| vec![value.to_owned(); n];
    let keys: Vec<String> = requests.iter().map(|(key, _)| (*key).to_owned()).collect();
    let froms: Vec<String> = requests
        .iter()
        .map(|(_, from)| (*from).to_owned())
        .collect();
    let hashes: Vec<String> = keys.iter().map(|key| format!("h-{key}")).collect();
    let order_ids: Vec<Option<String>> = vec![None; n];
    let tx = db.client.transaction().await.unwrap();
    let result = tx
        .query(
            points_ledger::batch::BATCH_CALL_SQL,
            &[
                &text("app"),
                &keys,
                &hashes,
                &text("DEBIT"),
                &froms,
                &text("sys-redeem"),
                &vec![1_i64; n],
                &order_ids,
                &3_i32,
            ],
        )
        .await;
    tx.rollback().await.ok();
    result.err().map(|error| {
        error
            .code()
            .map(|code| code.code().to_owned())
            .unwrap_or_default()
    })
}

/// A call that names a key twice is refused with `LD004`
/// ([`points_ledger::batch::SQLSTATE_DUPLICATE_KEY_IN_BATCH`]) and records nothing,
/// whether both are new (the registration's INSERT inserts one of them: the check is
/// skipped only when it inserts every request), the key is already stored, or another
/// request of the call is refused by a freeze; distinct keys are answered.
#[tokio::test]
async fn a_key_named_twice_in_one_call_is_refused() {
    let mut db = TestDb::new("b_twice").await;
    for request in before() {
        transfer_in(TransferMode::Batch, &mut db.client, &request, &NoHooks)
            .await
            .unwrap();
    }
    let refused = Some(points_ledger::batch::SQLSTATE_DUPLICATE_KEY_IN_BATCH.to_owned());
    let one = "acct-0001";
    assert_eq!(
        raw_batch_error(&mut db, &[("k-a", one), ("k-b", one)]).await,
        None
    );
    let twice = [("k-a", one), ("k-b", one), ("k-a", one)];
    assert_eq!(raw_batch_error(&mut db, &twice).await, refused);
    let stored = [("k-used", "acct-0003"), ("k-used", "acct-0003")];
    assert_eq!(raw_batch_error(&mut db, &stored).await, refused);
    db.client
        .batch_execute("INSERT INTO account_freeze (account_id, repair_id) VALUES ('acct-0003', 1)")
        .await
        .unwrap();
    let beside_a_frozen = [("k-c", one), ("k-d", "acct-0003"), ("k-c", one)];
    assert_eq!(raw_batch_error(&mut db, &beside_a_frozen).await, refused);
    let distinct_beside_a_frozen = [("k-c", one), ("k-d", "acct-0003")];
    assert_eq!(
        raw_batch_error(&mut db, &distinct_beside_a_frozen).await,
        None
    );
    assert_eq!(
        counts(&db).await.0,
        3,
        "only the three transactions of before()"
    );
}
