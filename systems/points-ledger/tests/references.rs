//! The entries' references (SPEC §2.2): `ledger_entry.txn_id` names a `ledger_txn` row and
//! `ledger_entry.account_id` an `account` row. Whatever enforces them (declared foreign
//! keys, or the schema's set-based check with append-only guards), these are the refusals
//! a writer and a reader of the tables see: SQLSTATE 23503 naming the reference, in the
//! words PostgreSQL gives a declared key's violation, for an orphan entry from every
//! writer and from plain SQL, for a delete or key change of a referenced row, also while
//! the referencing transaction is still open, and nothing of a refused statement kept.

mod common;

use points_ledger::batch::transfer_batch;
use points_ledger::{
    LedgerError, NoHooks, TransferMode, TransferRequest, between, grant, reconcile,
    transfer_between, transfer_in,
};
use tokio_postgres::Client;

use common::TestDb;

/// The reference to `ledger_txn` and its words.
const TXN_REFERENCE: &str = "ledger_entry_txn_id_fkey";
/// The reference to `account` and its words.
const ACCOUNT_REFERENCE: &str = "ledger_entry_account_id_fkey";

/// A row trigger planted for the test that turns every entry written into an orphan:
/// `txn` moves its `txn_id` past every transaction, `account` names an account that does
/// not exist. It runs before the row is stored, so whatever checks the references sees
/// the orphan, whichever writer wrote the entry.
const PLANT_ORPHAN_SQL: &str = r#"
CREATE FUNCTION plant_orphan() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_ARGV[0] = 'txn' THEN
        NEW.txn_id := NEW.txn_id + 1000000000;
    ELSE
        NEW.account_id := 'acct-ghost';
    END IF;
    RETURN NEW;
END
$fn$;
"#;

/// The SQLSTATE of `error`, with its shown text.
fn refusal(error: &LedgerError) -> (Option<&str>, String) {
    (error.sqlstate(), error.to_string())
}

/// Asserts that `error` is the refusal of an orphan entry by `reference`.
fn assert_orphan_refused(error: &LedgerError, reference: &str, writer: &str) {
    let (code, text) = refusal(error);
    assert_eq!(code, Some("23503"), "{writer}: {text}");
    let words = format!(
        "insert or update on table \"ledger_entry\" violates foreign key constraint \"{reference}\""
    );
    assert!(text.contains(&words), "{writer}: {text}");
    let missing = if reference == TXN_REFERENCE {
        "is not present in table \"ledger_txn\"."
    } else {
        "Key (account_id)=(acct-ghost) is not present in table \"account\"."
    };
    assert!(text.contains(missing), "{writer}: {text}");
}

/// The requests each writer executes, by writer name: one each, each key its own.
async fn write_once(client: &mut Client, writer: &str, key: &str) -> Result<(), LedgerError> {
    let debit = TransferRequest::debit("refs", key, "acct-0001", 5);
    match writer {
        "statements" => transfer_in(TransferMode::Statements, client, &debit, &NoHooks)
            .await
            .map(drop),
        "onetrip" => transfer_in(TransferMode::OneTrip, client, &debit, &NoHooks)
            .await
            .map(drop),
        "batch" => {
            let answers = transfer_batch(client, &[debit], &NoHooks).await;
            answers.into_iter().next().expect("one answer").map(drop)
        }
        "between" => {
            let request = between("refs", key, "acct-0001", "acct-0002", 5);
            transfer_between(client, &request, &NoHooks).await.map(drop)
        }
        other => panic!("no writer {other}"),
    }
}

/// Every writer of entries: the statement transfer, the one-trip and batch functions, and
/// the transfer between two accounts.
const WRITERS: [&str; 4] = ["statements", "onetrip", "batch", "between"];

#[tokio::test]
async fn every_writer_has_an_orphan_entry_refused_and_keeps_nothing() {
    let mut db = TestDb::new("refs_writers").await;
    grant(&mut db.client, "refs", "g-1", "acct-0001", 1000)
        .await
        .unwrap();
    db.client.batch_execute(PLANT_ORPHAN_SQL).await.unwrap();
    let txns_before: i64 = db
        .client
        .query_one("SELECT count(*) FROM ledger_txn", &[])
        .await
        .unwrap()
        .get(0);
    for (planted, reference) in [("txn", TXN_REFERENCE), ("account", ACCOUNT_REFERENCE)] {
        db.client
            .batch_execute(&format!(
                "CREATE TRIGGER plant_orphan BEFORE INSERT ON ledger_entry \
                 FOR EACH ROW EXECUTE FUNCTION plant_orphan('{planted}')"
            ))
            .await
            .unwrap();
        for writer in WRITERS {
            let key = format!("k-{planted}-{writer}");
            let error = write_once(&mut db.client, writer, &key)
                .await
                .expect_err(writer);
            assert_orphan_refused(&error, reference, writer);
        }
        db.client
            .batch_execute("DROP TRIGGER plant_orphan ON ledger_entry")
            .await
            .unwrap();
    }
    let txns_after: i64 = db
        .client
        .query_one("SELECT count(*) FROM ledger_txn", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        txns_after, txns_before,
        "a refused write keeps no transaction"
    );
    assert_eq!(db.balance("acct-0001").await, 1000);
    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
    for writer in WRITERS {
        write_once(&mut db.client, writer, &format!("k-after-{writer}"))
            .await
            .unwrap_or_else(|e| panic!("{writer} after the plant: {e}"));
    }
    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
}

/// The server's error of `sql` on `client`: (SQLSTATE, constraint, message, detail).
async fn server_error(client: &Client, sql: &str) -> (String, String, String, String) {
    let error = client.batch_execute(sql).await.expect_err(sql);
    let db = error
        .as_db_error()
        .unwrap_or_else(|| panic!("{sql}: {error}"));
    (
        db.code().code().to_owned(),
        db.constraint().unwrap_or_default().to_owned(),
        db.message().to_owned(),
        db.detail().unwrap_or_default().to_owned(),
    )
}

#[tokio::test]
async fn an_orphan_insert_by_sql_gets_the_declared_keys_words() {
    let mut db = TestDb::new("refs_sql").await;
    let done = grant(&mut db.client, "refs", "g-1", "acct-0001", 100)
        .await
        .unwrap();
    let txn = done.txn_id.expect("a grant's transaction");
    let sql =
        "INSERT INTO ledger_entry (txn_id, account_id, amount) VALUES (987654321, 'acct-0001', 5)";
    assert_eq!(
        server_error(&db.client, sql).await,
        (
            "23503".to_owned(),
            TXN_REFERENCE.to_owned(),
            format!(
                "insert or update on table \"ledger_entry\" violates foreign key constraint \"{TXN_REFERENCE}\""
            ),
            "Key (txn_id)=(987654321) is not present in table \"ledger_txn\".".to_owned(),
        )
    );
    // Two rows, one of them an orphan: the statement is refused whole.
    let sql = format!(
        "INSERT INTO ledger_entry (txn_id, account_id, amount) \
         VALUES ({txn}, 'acct-0001', 5), ({txn}, 'acct-nobody', -5)"
    );
    assert_eq!(
        server_error(&db.client, &sql).await,
        (
            "23503".to_owned(),
            ACCOUNT_REFERENCE.to_owned(),
            format!(
                "insert or update on table \"ledger_entry\" violates foreign key constraint \"{ACCOUNT_REFERENCE}\""
            ),
            "Key (account_id)=(acct-nobody) is not present in table \"account\".".to_owned(),
        )
    );
    let sql = format!(
        "UPDATE ledger_entry SET account_id = 'acct-nobody' WHERE txn_id = {txn} AND amount > 0"
    );
    let (code, constraint, _, _) = server_error(&db.client, &sql).await;
    assert_eq!(
        (code.as_str(), constraint.as_str()),
        ("23503", ACCOUNT_REFERENCE)
    );
    let entries: i64 = db
        .client
        .query_one(
            "SELECT count(*) FROM ledger_entry WHERE txn_id = $1",
            &[&txn],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(entries, 2, "only the grant's own two entries");
    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
}

#[tokio::test]
async fn a_referenced_row_is_neither_deleted_nor_rekeyed() {
    let mut db = TestDb::new("refs_guard").await;
    let done = grant(&mut db.client, "refs", "g-1", "acct-0001", 100)
        .await
        .unwrap();
    let txn = done.txn_id.expect("a grant's transaction");
    for (sql, reference, table) in [
        (
            "DELETE FROM account WHERE account_id = 'acct-0001'".to_owned(),
            ACCOUNT_REFERENCE,
            "account",
        ),
        (
            "UPDATE account SET account_id = 'acct-moved' WHERE account_id = 'acct-0001'"
                .to_owned(),
            ACCOUNT_REFERENCE,
            "account",
        ),
        (
            format!("DELETE FROM ledger_txn WHERE txn_id = {txn}"),
            TXN_REFERENCE,
            "ledger_txn",
        ),
        (
            format!("UPDATE ledger_txn SET txn_id = txn_id + 1000 WHERE txn_id = {txn}"),
            TXN_REFERENCE,
            "ledger_txn",
        ),
    ] {
        let (code, constraint, message, _) = server_error(&db.client, &sql).await;
        assert_eq!(
            (code.as_str(), constraint.as_str()),
            ("23503", reference),
            "{sql}"
        );
        let words = format!(
            "update or delete on table \"{table}\" violates foreign key constraint \"{reference}\" on table \"ledger_entry\""
        );
        assert_eq!(message, words, "{sql}");
    }
    assert_eq!(db.balance("acct-0001").await, 100);
    let findings = reconcile(&mut db.client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
}

#[tokio::test]
async fn a_delete_while_the_referencing_transaction_is_open_is_refused() {
    let db = TestDb::new("refs_open").await;
    // acct-0002 has no entry yet; a writer's transaction is about to give it some.
    let mut writer = db.connect().await;
    let tx = writer.transaction().await.unwrap();
    tx.batch_execute(
        "INSERT INTO idem_request (client_id, idem_key, request_hash, outcome) \
             VALUES ('refs', 'k-open', 'h', 'PENDING'); \
         WITH t AS (INSERT INTO ledger_txn (client_id, idem_key, kind) \
                    VALUES ('refs', 'k-open', 'GRANT') RETURNING txn_id) \
         INSERT INTO ledger_entry (txn_id, account_id, amount) \
         SELECT txn_id, 'sys-issuer', -7 FROM t UNION ALL SELECT txn_id, 'acct-0002', 7 FROM t; \
         UPDATE idem_request SET outcome = 'OK', \
             txn_id = (SELECT txn_id FROM ledger_txn WHERE idem_key = 'k-open'), balance_after = 7 \
             WHERE idem_key = 'k-open'; \
         UPDATE account SET balance = balance + 7 WHERE account_id = 'acct-0002'; \
         UPDATE account SET balance = balance - 7 WHERE account_id = 'sys-issuer';",
    )
    .await
    .unwrap();
    // Another session deletes the account meanwhile: refused, either at once or (behind
    // the open transaction's row lock) once it commits; never deleted.
    let deleter = db.connect().await;
    let deleter_pid: i32 = deleter
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let delete = tokio::spawn(async move {
        deleter
            .batch_execute("DELETE FROM account WHERE account_id = 'acct-0002'")
            .await
    });
    let observer = db.connect().await;
    while !delete.is_finished() {
        let waiting: bool = observer
            .query_one(
                "SELECT coalesce((SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1), false)",
                &[&deleter_pid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting {
            break;
        }
        tokio::task::yield_now().await;
    }
    tx.commit().await.unwrap();
    let error = delete.await.unwrap().expect_err("the delete is refused");
    let db_error = error.as_db_error().expect("a server error");
    assert_eq!(db_error.code().code(), "23503", "{}", db_error.message());
    assert_eq!(db_error.constraint(), Some(ACCOUNT_REFERENCE));
    let mut client = db.connect().await;
    assert_eq!(db.balance("acct-0002").await, 7);
    let findings = reconcile(&mut client).await.unwrap();
    assert!(findings.is_clean(), "{findings:?}");
}
