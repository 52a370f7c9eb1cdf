//! The store on real files in a temporary folder: the outcomes and errors of SPEC §9,
//! the hook points, reopening, concurrency, reconciliation and the naive variants.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier};

use inventory_store::naive::{DeferredReadThenWrite, apply_change_with_replace};
use inventory_store::{
    BUSY_TIMEOUT_MS, ChangeError, ChangeOutcome, ChangePoint, Finding, HookAbort, InvalidInput,
    Schema, Store, code_name, reconcile,
};
use serde_json::json;

const ITEM: i64 = 1;

/// A fresh file path in its own temporary folder (kept alive by the returned guard).
fn fresh_file() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inventory.sqlite");
    (dir, path)
}

fn store_with_item(units: i64) -> (tempfile::TempDir, PathBuf, Store) {
    let (dir, path) = fresh_file();
    let store = Store::open(&path).expect("open");
    store.add_item(ITEM, units).expect("add item");
    (dir, path, store)
}

#[test]
fn opening_sets_wal_full_sync_and_the_busy_timeout() {
    let (_dir, _path, store) = store_with_item(100);
    let connection = store.connection();
    let mode: String = connection
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .unwrap();
    let synchronous: i64 = connection
        .query_row("PRAGMA synchronous", [], |row| row.get(0))
        .unwrap();
    let timeout: i64 = connection
        .query_row("PRAGMA busy_timeout", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    assert_eq!(synchronous, 2);
    assert_eq!(timeout, BUSY_TIMEOUT_MS as i64);
    assert!(inventory_store::sqlite_version().starts_with("3."));
}

#[test]
fn s1_applied_replayed_mismatch() {
    let (_dir, _path, store) = store_with_item(100);
    assert_eq!(
        store.apply_change("receive-1", ITEM, 20).unwrap(),
        ChangeOutcome::Applied
    );
    assert_eq!(store.units(ITEM).unwrap(), Some(120));
    assert_eq!(
        store.apply_change("receive-1", ITEM, 20).unwrap(),
        ChangeOutcome::Replayed
    );
    let mismatch = store.apply_change("receive-1", ITEM, 25).unwrap_err();
    assert!(matches!(
        mismatch,
        ChangeError::Mismatch {
            stored_item: ITEM,
            stored_delta: 20
        }
    ));
    assert_eq!(store.units(ITEM).unwrap(), Some(120));
    assert_eq!(store.change_count().unwrap(), 1);
    assert_eq!(
        store.recorded_change("receive-1").unwrap(),
        Some((ITEM, 20))
    );
}

#[test]
fn s2_a_refused_change_leaves_its_key_free() {
    let (_dir, _path, store) = store_with_item(100);
    store.apply_change("receive-1", ITEM, 20).unwrap();
    let refused = store.apply_change("ship-1", ITEM, -121).unwrap_err();
    assert!(matches!(refused, ChangeError::Insufficient { units: 120 }));
    assert_eq!(store.recorded_change("ship-1").unwrap(), None);
    assert_eq!(store.units(ITEM).unwrap(), Some(120));
    assert_eq!(
        store.apply_change("ship-1", ITEM, -120).unwrap(),
        ChangeOutcome::Applied
    );
    assert_eq!(store.units(ITEM).unwrap(), Some(0));
    // At 0 units the replay is not re-checked against the stock.
    assert_eq!(
        store.apply_change("ship-1", ITEM, -120).unwrap(),
        ChangeOutcome::Replayed
    );
    assert_eq!(store.units(ITEM).unwrap(), Some(0));
}

#[test]
fn an_unknown_item_is_refused_and_stores_nothing() {
    let (_dir, _path, store) = store_with_item(100);
    let error = store.apply_change("ship-9", 9, -1).unwrap_err();
    assert!(matches!(error, ChangeError::UnknownItem));
    assert_eq!(store.change_count().unwrap(), 0);
}

#[test]
fn s3_bad_json_input_is_invalid_and_stores_nothing() {
    let (_dir, _path, store) = store_with_item(100);
    let inputs = [
        json!({"event_id": "", "item": 1, "delta": 5}),
        json!({"event_id": "   ", "item": 1, "delta": 5}),
        json!({"event_id": "\t\n", "item": 1, "delta": 5}),
        json!({"event_id": "bad-1", "item": 1, "delta": 0}),
        json!({"event_id": "bad-1", "item": 1, "delta": 1001}),
        json!({"event_id": "bad-1", "item": 1, "delta": -1001}),
        json!({"event_id": "bad-1", "item": 1, "delta": 1.5}),
        json!({"event_id": "bad-1", "item": 1, "delta": 5.0}),
        json!({"event_id": "bad-1", "item": 1, "delta": "5"}),
        json!({"event_id": "bad-1", "item": 1, "delta": true}),
        json!({"event_id": "bad-1", "item": 1, "delta": null}),
        json!({"event_id": "bad-1", "item": 1, "delta": u64::MAX}),
        json!({"event_id": "bad-1", "item": 1}),
        json!({"event_id": 7, "item": 1, "delta": 5}),
        json!({"event_id": null, "item": 1, "delta": 5}),
        json!({"event_id": "bad-1", "item": "1", "delta": 5}),
        json!({"event_id": "bad-1", "item": 0, "delta": 5}),
        json!({"event_id": "bad-1", "item": 1, "delta": 5, "note": "x"}),
        json!(["bad-1", 1, 5]),
    ];
    for input in &inputs {
        let error = store.apply_json(input).unwrap_err();
        assert!(
            matches!(error, ChangeError::Invalid(_)),
            "{input}: {error:?}"
        );
    }
    let exponent: serde_json::Value =
        serde_json::from_str(r#"{"event_id": "bad-1", "item": 1, "delta": 1e3}"#).unwrap();
    assert!(matches!(
        store.apply_json(&exponent),
        Err(ChangeError::Invalid(InvalidInput::WrongType { .. }))
    ));
    assert_eq!(store.change_count().unwrap(), 0);
    assert_eq!(store.units(ITEM).unwrap(), Some(100));
    assert_eq!(
        store
            .apply_json(&json!({"event_id": "ok-1", "item": 1, "delta": 1000}))
            .unwrap(),
        ChangeOutcome::Applied
    );
    let Err(ChangeError::Invalid(reason)) =
        store.apply_json(&json!({"event_id": "bad-1", "item": 1, "delta": 1.5}))
    else {
        panic!("1.5 must be invalid");
    };
    assert_eq!(
        reason,
        InvalidInput::WrongType {
            field: "delta",
            expected: "an integer",
            got: "1.5".into()
        }
    );
}

#[test]
fn s3_an_open_transaction_is_refused_and_left_untouched() {
    let (_dir, path, store) = store_with_item(100);
    let connection = store.connection();
    connection.execute_batch("BEGIN").unwrap();
    connection
        .execute("INSERT INTO stock (item_id, units) VALUES (2, 5)", [])
        .unwrap();
    let error = store.apply_change("receive-2", ITEM, 1).unwrap_err();
    assert!(matches!(error, ChangeError::InTransaction));
    // The caller's transaction is still open and still holds its row.
    assert!(!connection.is_autocommit());
    assert_eq!(store.units(2).unwrap(), Some(5));
    // Another connection does not see it yet.
    let other = Store::open(&path).unwrap();
    assert_eq!(other.units(2).unwrap(), None);
    connection.execute_batch("COMMIT").unwrap();
    assert_eq!(other.units(2).unwrap(), Some(5));
    assert_eq!(store.change_count().unwrap(), 0);
}

#[test]
fn ids_are_compared_exactly() {
    let (_dir, _path, store) = store_with_item(100);
    assert_eq!(
        store.apply_change("ship-1", ITEM, -1).unwrap(),
        ChangeOutcome::Applied
    );
    assert_eq!(
        store.apply_change("SHIP-1", ITEM, -1).unwrap(),
        ChangeOutcome::Applied
    );
    assert_eq!(
        store.apply_change(" ship-1", ITEM, -1).unwrap(),
        ChangeOutcome::Applied
    );
    assert_eq!(store.units(ITEM).unwrap(), Some(97));
    assert_eq!(store.change_count().unwrap(), 3);
}

#[test]
fn a_stop_before_commit_leaves_nothing_and_after_commit_leaves_the_change() {
    for point in ChangePoint::ALL {
        let (_dir, path, store) = store_with_item(100);
        let stop = |at: ChangePoint| {
            if at == point {
                Err(HookAbort::new("test stop"))
            } else {
                Ok(())
            }
        };
        let error = store
            .apply_change_with_hooks("ship-2", ITEM, -30, &stop)
            .unwrap_err();
        assert!(
            matches!(error, ChangeError::HookAborted { point: p, .. } if p == point),
            "{point}: {error:?}"
        );
        assert!(store.connection().is_autocommit(), "{point}: left open");
        let reopened = Store::open(&path).unwrap();
        let expected_units = if point.is_committed() { 70 } else { 100 };
        assert_eq!(
            reopened.units(ITEM).unwrap(),
            Some(expected_units),
            "{point}"
        );
        let expected = if point.is_committed() {
            ChangeOutcome::Replayed
        } else {
            ChangeOutcome::Applied
        };
        assert_eq!(
            reopened.apply_change("ship-2", ITEM, -30).unwrap(),
            expected,
            "{point}"
        );
        assert_eq!(reopened.units(ITEM).unwrap(), Some(70));
    }
}

#[test]
fn hook_points_are_passed_in_order_on_the_applied_path_only() {
    let (_dir, _path, store) = store_with_item(100);
    let seen = std::sync::Mutex::new(Vec::new());
    let record = |point: ChangePoint| {
        seen.lock().unwrap().push(point);
        Ok(())
    };
    store
        .apply_change_with_hooks("ship-3", ITEM, -1, &record)
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), ChangePoint::ALL.to_vec());
    seen.lock().unwrap().clear();
    store
        .apply_change_with_hooks("ship-3", ITEM, -1, &record)
        .unwrap();
    assert!(seen.lock().unwrap().is_empty(), "a replay passes no hook");
    let _ = store.apply_change_with_hooks("ship-4", ITEM, -500, &record);
    assert_eq!(*seen.lock().unwrap(), vec![ChangePoint::EventWritten]);
}

#[test]
fn s7_replay_after_reopen() {
    let (_dir, path, store) = store_with_item(100);
    for index in 1..=5 {
        store
            .apply_change(&format!("receive-{index}"), ITEM, index)
            .unwrap();
    }
    drop(store);
    let reopened = Store::open(&path).unwrap();
    for index in 1..=5 {
        assert_eq!(
            reopened
                .apply_change(&format!("receive-{index}"), ITEM, index)
                .unwrap(),
            ChangeOutcome::Replayed
        );
    }
    assert_eq!(reopened.units(ITEM).unwrap(), Some(115));
}

const NEAR_I64_MAX: i64 = 9_223_372_036_854_775_000;

#[test]
fn s9_the_typeof_check_refuses_an_overflow() {
    let (_dir, _path, store) = store_with_item(NEAR_I64_MAX);
    let error = store.apply_change("receive-9", ITEM, 1000).unwrap_err();
    assert!(
        matches!(error, ChangeError::CheckViolation { .. }),
        "{error:?}"
    );
    assert_eq!(store.units(ITEM).unwrap(), Some(NEAR_I64_MAX));
    assert_eq!(store.change_count().unwrap(), 0);
    assert!(reconcile(store.connection()).unwrap().is_empty());
}

#[test]
fn s9_without_the_typeof_check_sqlite_stores_a_real() {
    let (_dir, path) = fresh_file();
    let store = Store::open_with(&path, Schema::WithoutTypeCheck).unwrap();
    store.add_item(ITEM, NEAR_I64_MAX).unwrap();
    assert_eq!(
        store.apply_change("receive-9", ITEM, 1000).unwrap(),
        ChangeOutcome::Applied
    );
    let (stored_type, _text) = store.units_as_stored(ITEM).unwrap().unwrap();
    assert_eq!(stored_type, "real");
    let findings = reconcile(store.connection()).unwrap();
    assert!(matches!(
        findings.as_slice(),
        [Finding::NotAnInteger { item: ITEM, .. }]
    ));
}

#[test]
fn s8_replace_overwrites_and_applies_again() {
    let (_dir, _path, store) = store_with_item(100);
    apply_change_with_replace(&store, "receive-1", ITEM, 20).unwrap();
    let second = apply_change_with_replace(&store, "receive-1", ITEM, 25).unwrap();
    assert_eq!(second, ChangeOutcome::Applied);
    assert_eq!(store.units(ITEM).unwrap(), Some(145));
    assert_eq!(
        store.recorded_change("receive-1").unwrap(),
        Some((ITEM, 25))
    );
    let findings = reconcile(store.connection()).unwrap();
    assert_eq!(
        findings,
        vec![Finding::UnitsDisagree {
            item: ITEM,
            stored: 145,
            recomputed: 125
        }]
    );
}

/// The probe the S6 control relies on has teeth: where waiting could help (another
/// connection holds the write lock and this one has no transaction yet), SQLite calls the
/// busy handler, and the counting one gives up at once.
#[test]
fn the_busy_handler_probe_counts_a_wait_that_could_help() {
    let (_dir, path, mut store_a) = store_with_item(100);
    let store_b = Store::open(&path).unwrap();
    store_b
        .connection()
        .execute_batch("BEGIN IMMEDIATE")
        .unwrap();
    let busy_calls = store_a.count_busy_handler_calls().unwrap();
    let error = store_a
        .connection()
        .execute_batch("BEGIN IMMEDIATE")
        .unwrap_err();
    assert_eq!(code_name(&error), "SQLITE_BUSY");
    assert!(busy_calls.load(Ordering::SeqCst) >= 1);
    store_b.connection().execute_batch("ROLLBACK").unwrap();
    store_a.restore_busy_timeout().unwrap();
}

#[test]
fn s6_control_deferred_read_then_write_fails_at_once_after_another_commit() {
    let (_dir, path, mut store_a) = store_with_item(100);
    let store_b = Store::open(&path).unwrap();
    let busy_calls = store_a.count_busy_handler_calls().unwrap();
    let a = DeferredReadThenWrite::begin(&store_a, ITEM).unwrap();
    assert_eq!(a.units_read(), 100);
    store_b.apply_change("ship-b", ITEM, -7).unwrap();
    busy_calls.store(0, Ordering::SeqCst);
    let error = a.write(-7).unwrap_err();
    assert_eq!(code_name(&error), "SQLITE_BUSY_SNAPSHOT");
    // At once: SQLite did not call the busy handler, so it would not have waited for the
    // busy timeout either (an event, not a duration).
    assert_eq!(busy_calls.load(Ordering::SeqCst), 0);
    store_a.restore_busy_timeout().unwrap();
    assert!(store_a.connection().is_autocommit());
    assert_eq!(store_a.units(ITEM).unwrap(), Some(93));
}

#[test]
fn s6_control_without_an_interleaved_commit_the_write_succeeds() {
    // The control's anomaly needs the forced interleaving: without it, nothing fails (so
    // the case's check would report that the control did not misbehave).
    let (_dir, _path, store) = store_with_item(100);
    let a = DeferredReadThenWrite::begin(&store, ITEM).unwrap();
    assert!(a.write(-7).unwrap());
    assert_eq!(store.units(ITEM).unwrap(), Some(93));
}

#[test]
fn s6_32_writers_give_14_applied_18_insufficient_2_units() {
    let (_dir, path, store) = store_with_item(100);
    let barrier = Arc::new(Barrier::new(32));
    let threads: Vec<_> = (0..32)
        .map(|index| {
            let path = path.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let store = Store::open(&path).unwrap();
                barrier.wait();
                store
                    .apply_change(&format!("ship-{index:02}"), ITEM, -7)
                    .map_err(|error| error.kind())
            })
        })
        .collect();
    let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let applied = outcomes
        .iter()
        .filter(|o| **o == Ok(ChangeOutcome::Applied))
        .count();
    let insufficient = outcomes
        .iter()
        .filter(|o| **o == Err("insufficient"))
        .count();
    assert_eq!((applied, insufficient), (14, 18), "{outcomes:?}");
    assert_eq!(store.units(ITEM).unwrap(), Some(2));
    assert_eq!(store.change_count().unwrap(), 14);
    assert!(reconcile(store.connection()).unwrap().is_empty());
}

#[test]
fn reconciliation_names_a_tampered_item() {
    let (_dir, _path, store) = store_with_item(100);
    store.add_item(2, 50).unwrap();
    store.apply_change("receive-1", ITEM, 20).unwrap();
    store.apply_change("ship-2", 2, -10).unwrap();
    assert!(reconcile(store.connection()).unwrap().is_empty());
    store
        .connection()
        .execute("UPDATE stock SET units = units + 5 WHERE item_id = 2", [])
        .unwrap();
    let findings = reconcile(store.connection()).unwrap();
    assert_eq!(
        findings,
        vec![Finding::UnitsDisagree {
            item: 2,
            stored: 45,
            recomputed: 40
        }]
    );
    assert_eq!(
        findings[0].to_string(),
        "item=2 stored=45 recomputed=40 (stored = recomputed + 5)"
    );
}

#[test]
fn s4_the_recording_policy_replays_a_refusal_after_restock() {
    use inventory_store::recorded_refusals::{self, RecordedOutcome};
    let (_dir, _path, store) = store_with_item(100);
    recorded_refusals::install(&store).unwrap();
    let first = recorded_refusals::apply_change(&store, "ship-4", ITEM, -150).unwrap();
    assert_eq!(first, RecordedOutcome::Refused);
    let restock = recorded_refusals::apply_change(&store, "restock-4", ITEM, 100).unwrap();
    assert_eq!(restock, RecordedOutcome::Applied);
    let retry = recorded_refusals::apply_change(&store, "ship-4", ITEM, -150).unwrap();
    assert_eq!(retry, RecordedOutcome::RefusalReplayed);
    assert_eq!(store.units(ITEM).unwrap(), Some(200));
    let other = recorded_refusals::apply_change(&store, "ship-4", ITEM, -10).unwrap_err();
    assert!(matches!(other, ChangeError::Mismatch { .. }));
    assert!(reconcile(store.connection()).unwrap().is_empty());
}

#[test]
fn open_existing_refuses_a_missing_file() {
    let (_dir, path) = fresh_file();
    assert!(Store::open_existing(&path).is_err());
    assert!(!path.exists());
}
