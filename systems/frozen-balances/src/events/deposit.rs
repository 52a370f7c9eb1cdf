//! *deposit* (admin): funds from `sys-deposit` to an account (SPEC §8).

use serde::{Deserialize, Serialize};
use tokio_postgres::Client;

use super::{
    Registration, apply, begin, ensure_rows, finish, hook_in_tx, lock_and_check, register,
    retry_on_deadlock, write_movements,
};
use crate::asset::Asset;
use crate::decisions::{
    Deltas, Event, EventRequest, LockedRows, Outcome, add_delta, check_id, recorded,
};
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

impl EventRequest for DepositRequest {
    const KIND: EventKind = EventKind::Deposit;

    fn tenant_id(&self) -> &str {
        &self.tenant_id
    }

    fn business_id(&self) -> &str {
        &self.business_id
    }

    /// `DEPOSIT|account|asset|amount`.
    fn payload(&self) -> String {
        format!(
            "DEPOSIT|{}|{}|{}",
            self.account_id,
            self.asset.as_str(),
            self.amount
        )
    }
}

impl DepositRequest {
    /// Checks the request before any database access: ids, not a system account, an
    /// amount of 1 to the asset's maximum (minor units).
    ///
    /// Errors: [`FrozenError::Invalid`].
    pub fn check(&self) -> Result<(), FrozenError> {
        check_id("tenant id", &self.tenant_id)?;
        check_id("business id", &self.business_id)?;
        check_id("account id", &self.account_id)?;
        if is_system_account(&self.account_id) {
            return Err(FrozenError::Invalid(format!(
                "{} is a system account",
                self.account_id
            )));
        }
        if self.amount <= 0 || self.amount > self.asset.max_units() {
            return Err(FrozenError::Invalid(format!(
                "deposit amount must be 1 to {} {} units",
                self.asset.max_units(),
                self.asset
            )));
        }
        Ok(())
    }

    /// The balance rows a deposit creates at 0 when missing: the account's and the
    /// tenant's `sys-deposit` (with `allow_negative`), `(account, asset, allow_negative)`.
    pub fn balance_rows(&self) -> [(&str, Asset, bool); 2] {
        [
            (&self.account_id, self.asset, false),
            (SYS_DEPOSIT, self.asset, true),
        ]
    }

    /// The deposit's changes: `sys-deposit` available −amount, the account's available
    /// +amount (minor units).
    ///
    /// Errors: [`FrozenError::InvariantViolated`] (a delta overflow).
    pub fn deltas(&self) -> Result<Deltas, FrozenError> {
        let mut deltas = Deltas::new();
        add_delta(&mut deltas, SYS_DEPOSIT, self.asset, -self.amount, 0)?;
        add_delta(&mut deltas, &self.account_id, self.asset, self.amount, 0)?;
        Ok(deltas)
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

recorded!(DepositResult);

impl DepositResult {
    /// The OK result of `req`, from the `locked` rows (their `available` before it).
    ///
    /// Errors: [`FrozenError::InvariantViolated`] when the account's row is not locked.
    pub fn credited(req: &DepositRequest, locked: &LockedRows) -> Result<Self, FrozenError> {
        let before = locked
            .get(&(req.account_id.clone(), req.asset.as_str()))
            .ok_or_else(|| FrozenError::InvariantViolated("the credited row is not locked".into()))?
            .available;
        Ok(DepositResult {
            outcome: Outcome::Ok,
            asset: req.asset,
            amount: req.amount,
            available: before + req.amount,
            replayed: false,
        })
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
    req.check()?;
    retry_on_deadlock!(deposit_once(client, req, hooks))
}

async fn deposit_once(
    client: &mut Client,
    req: &DepositRequest,
    hooks: &dyn Hooks,
) -> Result<DepositResult, FrozenError> {
    let event = Event::of(req);
    let tx = begin(client).await?;
    let operation_id = match register::<DepositResult>(&tx, &event).await? {
        Registration::New(id) => id,
        Registration::Replay(result) => {
            tx.rollback().await?;
            return Ok(result);
        }
    };
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::Registered).await?;
    ensure_rows(&tx, &req.tenant_id, &req.balance_rows()).await?;
    let deltas = req.deltas()?;
    let locked = match lock_and_check(&tx, &req.tenant_id, &deltas).await {
        Ok(locked) => locked,
        Err(error) => {
            let _ = tx.rollback().await;
            return Err(error);
        }
    };
    let result = DepositResult::credited(req, &locked)?;
    apply(&tx, &req.tenant_id, &deltas).await?;
    let tx = hook_in_tx(tx, hooks, &event, HookPoint::BalancesUpdated).await?;
    write_movements(&tx, &event, &deltas).await?;
    finish(tx, hooks, &event, operation_id, Outcome::Ok, result).await
}
