//! *place* on InnoDB: an order freezes its funds (SPEC §8).

use frozen_balances::amount::Freeze;
use frozen_balances::hooks::{HookPoint, Hooks};
use frozen_balances::{Event, Outcome, PlaceRequest, PlaceResult};
use mysql_async::Transaction;
use mysql_async::prelude::Queryable;

use super::{Tally, ensure_rows, expect_one, hook, retry_on_deadlock, run_once, write_movements};
use crate::InnoError;

// The conditional freeze. UPDATE is a locking read: it waits for a concurrent writer of
// the row and evaluates the WHERE on the latest committed version, whatever the
// isolation level, so "enough available?" and "freeze it" are one evaluation. MariaDB
// has no UPDATE … RETURNING: the affected-rows count (matched rows, CLIENT_FOUND_ROWS)
// says whether it froze.
// ANCHOR: freeze (quoted by docs/articles/frozen-balances.md; `./run.sh cite --check`)
const FREEZE_SQL: &str = "\
UPDATE balance SET available = available - ?, frozen = frozen + ?, version = version + 1
WHERE tenant_id = ? AND account_id = ? AND asset = ? AND available >= ?";
// ANCHOR_END: freeze

// A locking read: the latest committed value (the row is locked by the UPDATE above),
// not the transaction's snapshot.
const AVAILABLE_SQL: &str = "\
SELECT available FROM balance WHERE tenant_id = ? AND account_id = ? AND asset = ? FOR UPDATE";

const INSERT_ORDER_SQL: &str = "\
INSERT INTO spot_order (tenant_id, account_id, place_business_id, market, side, quantity,
                        limit_price, frozen_asset, frozen_amount, fee_reserve)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// Places `req` as `frozen_balances::place` does on PostgreSQL: registers its business
/// id, freezes `quantity × limit` plus the fee reserve (BUY) or `quantity` (SELL) with a
/// conditional UPDATE, writes the movement and the order, records OK; not enough
/// available → records INSUFFICIENT. Hooks: `registered`, `balances-updated` (OK path),
/// `before-commit`, `after-commit`.
///
/// Errors: [`frozen_balances::FrozenError`] refusals as [`InnoError::Frozen`] (invalid,
/// payload mismatch, hook abort, deadlock retries exhausted); [`InnoError::Server`].
pub async fn place(
    conn: &mut mysql_async::Conn,
    req: &PlaceRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<PlaceResult, InnoError> {
    let freeze = req.freeze()?;
    retry_on_deadlock!(tally, place_once(conn, req, freeze, hooks, tally))
}

pub(crate) async fn place_once(
    conn: &mut mysql_async::Conn,
    req: &PlaceRequest,
    freeze: Freeze,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<PlaceResult, InnoError> {
    let event = Event::of(req);
    run_once(conn, &event, hooks, tally, async |tx| {
        freeze_and_record(tx, &event, req, &freeze, hooks).await
    })
    .await
}

/// Inside `tx`: the freeze, then (OK) `balances-updated`, the movement and the order, or
/// (refused) the INSUFFICIENT result.
async fn freeze_and_record(
    tx: &mut Transaction<'_>,
    event: &Event<'_>,
    req: &PlaceRequest,
    freeze: &Freeze,
    hooks: &dyn Hooks,
) -> Result<(Outcome, PlaceResult), InnoError> {
    ensure_rows(tx, &req.tenant_id, &req.balance_rows()).await?;
    let asset = freeze.asset.as_str();
    tx.exec_drop(
        FREEZE_SQL,
        (
            freeze.amount,
            freeze.amount,
            &req.tenant_id,
            &req.account_id,
            asset,
            freeze.amount,
        ),
    )
    .await?;
    let froze = tx.affected_rows() == 1;
    let available: Option<i64> = tx
        .exec_first(AVAILABLE_SQL, (&req.tenant_id, &req.account_id, asset))
        .await?;
    let available = available.ok_or_else(|| InnoError::invariant("balance row vanished"))?;
    if !froze {
        return Ok((
            Outcome::Insufficient,
            PlaceResult::refused(freeze, available),
        ));
    }
    hook(event, hooks, HookPoint::BalancesUpdated).await?;
    let order_id = record_order(tx, event, req, freeze).await?;
    Ok((
        Outcome::Ok,
        PlaceResult::placed(freeze, order_id, available),
    ))
}

/// Inside `tx`, after the freeze: writes its movement and the order row; the new order's
/// id.
async fn record_order(
    tx: &mut Transaction<'_>,
    event: &Event<'_>,
    req: &PlaceRequest,
    freeze: &Freeze,
) -> Result<i64, InnoError> {
    write_movements(tx, event, &req.freeze_deltas(freeze)?).await?;
    tx.exec_drop(
        INSERT_ORDER_SQL,
        (
            &req.tenant_id,
            &req.account_id,
            &req.business_id,
            req.market.as_str(),
            req.side.as_str(),
            req.quantity,
            req.limit_price,
            freeze.asset.as_str(),
            freeze.amount,
            freeze.fee_reserve,
        ),
    )
    .await?;
    expect_one(tx, "the new order")?;
    tx.last_insert_id()
        .map(|id| id as i64)
        .ok_or_else(|| InnoError::invariant("no id for the new order"))
}
