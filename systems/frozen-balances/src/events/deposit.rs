//! *deposit* (admin): funds from `sys-deposit` to an account (SPEC §8).

use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use super::{
    Deltas, Event, Outcome, Recorded, Registration, add_delta, apply, begin, check_id, ensure_rows,
    finish, hook_in_tx, lock_and_check, register, retry_on_deadlock, write_movements,
};
use crate::asset::Asset;
use crate::error::FrozenError;
use crate::hooks::{EventKind, HookPoint, Hooks};
use crate::schema::{SYS_DEPOSIT, is_system_account};

/// A deposit of `amount` minor units of `asset` to `account_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepositRequest {
    /// Tenant.
    pub tenant_id: String,
    /// The deposit's business id.
    pub business_id: String,
    /// The credited account (not a system account; created on demand).
    pub account_id: String,
    /// The asset.
    pub asset: Asset,
    /// Minor units, 1 to the asset's maximum.
    pub amount: i64,
}

impl DepositRequest {
    /// `DEPOSIT|account|asset|amount`.
    pub fn payload(&self) -> String {
        format!(
            "DEPOSIT|{}|{}|{}",
            self.account_id,
            self.asset.as_str(),
            self.amount
        )
    }
}

/// What a deposit reports, the same on every replay (except `replayed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepositResult {
    /// Always OK.
    pub outcome: Outcome,
    /// The asset.
    pub asset: Asset,
    /// Minor units deposited.
    pub amount: i64,
    /// The account's available after the deposit, minor units.
    pub available: i64,
    /// Read back from an earlier request with the same id; nothing executed now.
    #[serde(skip)]
    pub replayed: bool,
}

impl Recorded for DepositResult {
    fn mark_replayed(&mut self) {
        self.replayed = true;
    }
}

/// Deposits: `sys-deposit` available − amount, the account's available + amount, both
/// rows locked in sorted order, created on demand (the tenant's `sys-deposit` with
/// `allow_negative`).
///
/// Errors: [`FrozenError::Invalid`] (ids, a system account, amount outside 1 to the
/// maximum) before any database access; [`FrozenError::InvariantViolated`] if the
/// account's available would leave the 64-bit range (rolled back, not recorded);
/// [`FrozenError::PayloadMismatch`]; [`FrozenError::HookAborted`]; [`FrozenError::Db`].
pub async fn deposit(
    client: &mut Client,
    req: &DepositRequest,
    hooks: &dyn Hooks,
) -> Result<DepositResult, FrozenError> {
    check_id("tenant id", &req.tenant_id)?;
    check_id("business id", &req.business_id)?;
    check_id("account id", &req.account_id)?;
    if is_system_account(&req.account_id) {
        return Err(FrozenError::Invalid(format!(
            "{} is a system account",
            req.account_id
        )));
    }
    if req.amount <= 0 || req.amount > req.asset.max_units() {
        return Err(FrozenError::Invalid(format!(
            "deposit amount must be 1 to {} {} units",
            req.asset.max_units(),
            req.asset
        )));
    }
    retry_on_deadlock!(deposit_once(client, req, hooks))
}

async fn deposit_once(
    client: &mut Client,
    req: &DepositRequest,
    hooks: &dyn Hooks,
) -> Result<DepositResult, FrozenError> {
    let event = Event::new(
        EventKind::Deposit,
        &req.tenant_id,
        &req.business_id,
        req.payload(),
    );
    let tx = begin(client).await?;
    let operation_id = match register::<DepositResult>(&tx, &event).await? {
        Registration::New(id) => id,
        Registration::Replay(result) => {
            tx.rollback().await?;
            return Ok(result);
        }
    };
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::Registered).await?;
    ensure_rows(
        &tx,
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
    let locked = match lock_and_check(&tx, &req.tenant_id, &deltas).await {
        Ok(locked) => locked,
        Err(error) => {
            let _ = tx.rollback().await;
            return Err(error);
        }
    };
    let before = locked[&(req.account_id.clone(), req.asset.as_str())].available;
    apply(&tx, &req.tenant_id, &deltas).await?;
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::BalancesUpdated).await?;
    write_movements(&tx, &event, &deltas).await?;
    let result = DepositResult {
        outcome: Outcome::Ok,
        asset: req.asset,
        amount: req.amount,
        available: before + req.amount,
        replayed: false,
    };
    finish(tx, hooks, &event, operation_id, Outcome::Ok, result).await
}
