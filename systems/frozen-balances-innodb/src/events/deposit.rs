//! *deposit* on InnoDB (admin): funds from `sys-deposit` to an account (SPEC §8).

use frozen_balances::hooks::{HookPoint, Hooks};
use frozen_balances::{DepositRequest, DepositResult, Event, Outcome};
use mysql_async::Transaction;

use super::{
    Tally, apply, ensure_rows, hook, lock_and_check, retry_on_deadlock, run_once, write_movements,
};
use crate::InnoError;

/// Deposits `req.amount` of `req.asset` to `req.account_id` from `sys-deposit`, as
/// `frozen_balances::deposit` does. Hooks: `registered`, `balances-updated`,
/// `before-commit`, `after-commit`.
///
/// Errors: as [`super::place`].
pub async fn deposit(
    conn: &mut mysql_async::Conn,
    req: &DepositRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<DepositResult, InnoError> {
    req.check()?;
    retry_on_deadlock!(tally, deposit_once(conn, req, hooks, tally))
}

async fn deposit_once(
    conn: &mut mysql_async::Conn,
    req: &DepositRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<DepositResult, InnoError> {
    let event = Event::of(req);
    run_once(conn, &event, hooks, tally, async |tx| {
        Ok((Outcome::Ok, credit(tx, &event, req, hooks).await?))
    })
    .await
}

async fn credit(
    tx: &mut Transaction<'_>,
    event: &Event<'_>,
    req: &DepositRequest,
    hooks: &dyn Hooks,
) -> Result<DepositResult, InnoError> {
    ensure_rows(tx, &req.tenant_id, &req.balance_rows()).await?;
    let deltas = req.deltas()?;
    let locked = lock_and_check(tx, &req.tenant_id, &deltas).await?;
    let result = DepositResult::credited(req, &locked)?;
    apply(tx, &req.tenant_id, &deltas).await?;
    hook(event, hooks, HookPoint::BalancesUpdated).await?;
    write_movements(tx, event, &deltas).await?;
    Ok(result)
}
