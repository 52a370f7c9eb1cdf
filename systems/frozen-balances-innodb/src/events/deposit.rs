//! *deposit* on InnoDB (admin): funds from `sys-deposit` to an account (SPEC §8).

use frozen_balances::events::check_id;
use frozen_balances::hooks::{EventKind, HookPoint, Hooks};
use frozen_balances::schema::{SYS_DEPOSIT, is_system_account};
use frozen_balances::{Deltas, DepositRequest, DepositResult, FrozenError, Outcome, add_delta};
use mysql_async::Transaction;

use super::{
    Event, Tally, apply, ensure_rows, lock_and_check, retry_on_deadlock, run_once, write_movements,
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
    check_id("tenant id", &req.tenant_id)?;
    check_id("business id", &req.business_id)?;
    check_id("account id", &req.account_id)?;
    if is_system_account(&req.account_id) {
        return Err(FrozenError::Invalid(format!("{} is a system account", req.account_id)).into());
    }
    if req.amount <= 0 || req.amount > req.asset.max_units() {
        return Err(FrozenError::Invalid(format!(
            "deposit amount must be 1 to {} {} units",
            req.asset.max_units(),
            req.asset
        ))
        .into());
    }
    retry_on_deadlock!(tally, deposit_once(conn, req, hooks, tally))
}

async fn deposit_once(
    conn: &mut mysql_async::Conn,
    req: &DepositRequest,
    hooks: &dyn Hooks,
    tally: &Tally,
) -> Result<DepositResult, InnoError> {
    let event = Event::new(
        EventKind::Deposit,
        &req.tenant_id,
        &req.business_id,
        req.payload(),
    );
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
    ensure_rows(
        tx,
        &req.tenant_id,
        &[
            (&req.account_id, req.asset, false),
            (SYS_DEPOSIT, req.asset, true),
        ],
    )
    .await?;
    let mut deltas = Deltas::new();
    add_delta(&mut deltas, SYS_DEPOSIT, req.asset, -req.amount, 0)?;
    add_delta(&mut deltas, &req.account_id, req.asset, req.amount, 0)?;
    let before = lock_and_check(tx, &req.tenant_id, &deltas).await?;
    let index = deltas
        .keys()
        .position(|(account, _)| account == &req.account_id)
        .unwrap_or_default();
    apply(tx, &req.tenant_id, &deltas).await?;
    event.hook(hooks, HookPoint::BalancesUpdated).await?;
    write_movements(tx, event, &deltas).await?;
    Ok(DepositResult {
        outcome: Outcome::Ok,
        asset: req.asset,
        amount: req.amount,
        available: before[index] + req.amount,
        replayed: false,
    })
}
