//! The designs the family's negative controls run, beside the product they refute.
//!
//! - [`register_reading_inside`]: after a duplicate key, reads the committed operation
//!   inside the failed REPEATABLE READ transaction (what the seed warns against).
//! - [`place_without_retry`]: the product's placement with no retry on deadlock (1213).

use frozen_balances::hooks::Hooks;
use frozen_balances::{Asset, PlaceRequest, PlaceResult};
use mysql_async::prelude::Queryable;
use mysql_async::{IsolationLevel, TxOpts};

use crate::error::ER_DUP_ENTRY;
use crate::events::{Tally, place_once, read_operation};
use crate::{InnoError, query};

/// What [`register_reading_inside`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InsideRead {
    /// The INSERT succeeded: nobody had the business id (rolled back: it only looks).
    Registered,
    /// Duplicate key, and the read inside the same transaction found the operation with
    /// this outcome.
    Found(String),
    /// Duplicate key, and the read inside the same transaction found nothing.
    NotFound,
}

/// The naive registration: one REPEATABLE READ transaction that first reads the
/// account's `asset` balance (a plain consistent read: the transaction's snapshot is
/// taken here), then inserts the operation `(tenant_id, business_id)`, and on a
/// duplicate key (1062) reads the operation **in the same transaction**. Rolls back in
/// every case.
///
/// Errors: the server's, other than 1062.
pub async fn register_reading_inside(
    conn: &mut mysql_async::Conn,
    tenant_id: &str,
    business_id: &str,
    account_id: &str,
    asset: Asset,
) -> Result<InsideRead, InnoError> {
    let mut options = TxOpts::default();
    options.with_isolation_level(IsolationLevel::RepeatableRead);
    let mut tx = conn.start_transaction(options).await?;
    query::balance(&mut tx, tenant_id, account_id, asset).await?;
    let inserted = tx
        .exec_drop(
            "INSERT INTO balance_operation (tenant_id, business_id, kind, payload, payload_hash, outcome) \
             VALUES (?, ?, 'PLACE', 'naive', 'naive', 'PENDING')",
            (tenant_id, business_id),
        )
        .await
        .map_err(InnoError::from);
    let seen = match inserted {
        Ok(()) => InsideRead::Registered,
        Err(error) if error.code() == Some(ER_DUP_ENTRY) => {
            match read_operation(&mut tx, tenant_id, business_id).await? {
                Some((_, outcome, _)) => InsideRead::Found(outcome),
                None => InsideRead::NotFound,
            }
        }
        Err(error) => {
            let _ = tx.rollback().await;
            return Err(error);
        }
    };
    tx.rollback().await?;
    Ok(seen)
}

/// The product's placement, one attempt: a deadlock (1213) reaches the caller as
/// [`InnoError::Server`] instead of being retried.
///
/// Errors: as `crate::place`, and 1213.
pub async fn place_without_retry(
    conn: &mut mysql_async::Conn,
    req: &PlaceRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<PlaceResult, InnoError> {
    let freeze = req.freeze()?;
    place_once(conn, req, freeze, hooks, tally).await
}
