//! Named hook points inside every event's transaction, for fault injection.
//!
//! The shape follows the points ledger's `points_ledger::Hooks` (an async call per point that
//! may hold or abort), but with this system's own points and context: the ledger's
//! context carries a `TransferRequest`, which an exchange event does not have, and this
//! crate must not depend on the service that serves it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use tokio_postgres::Transaction;

/// A boxed future that may be sent between threads: what a hook returns. The same type as
/// `futures_util::future::BoxFuture`, written with the standard library's own types.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The kind of a business event, stored in `balance_operation.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EventKind {
    /// An order's placement: freezes funds.
    Place,
    /// One fill's settlement (the matching engine's call).
    Fill,
    /// An order's cancel: releases its remainder.
    Cancel,
    /// A deposit from `sys-deposit` (admin).
    Deposit,
    /// A withdrawal request: freezes its amount ([`crate::withdraw`]).
    Withdraw,
    /// A withdrawal's settlement: consumes (CONFIRMED) or releases (FAILED, REJECTED)
    /// what the request froze ([`crate::withdraw`]).
    WithdrawSettle,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 6] = [
        EventKind::Place,
        EventKind::Fill,
        EventKind::Cancel,
        EventKind::Deposit,
        EventKind::Withdraw,
        EventKind::WithdrawSettle,
    ];

    /// The stored spelling: `PLACE`, `FILL`, `CANCEL`, `DEPOSIT`, `WITHDRAW`,
    /// `WITHDRAW_SETTLE`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Place => "PLACE",
            EventKind::Fill => "FILL",
            EventKind::Cancel => "CANCEL",
            EventKind::Deposit => "DEPOSIT",
            EventKind::Withdraw => "WITHDRAW",
            EventKind::WithdrawSettle => "WITHDRAW_SETTLE",
        }
    }
}

/// A point inside an event where [`Hooks::at`] is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HookPoint {
    /// The `balance_operation` row is inserted as `PENDING` (a concurrent event with the
    /// same tenant and business id waits); nothing else is written yet.
    Registered,
    /// The balance rows are updated, the `balance_movement` rows not yet written (only on
    /// the paths that move funds).
    BalancesUpdated,
    /// Immediately before `COMMIT`, the outcome recorded (every committing path).
    BeforeCommit,
    /// After `COMMIT`, before the result is returned (in the service: before the
    /// response is written). No transaction any more.
    AfterCommit,
}

impl HookPoint {
    /// All points, in the order an executed event passes them.
    pub const ALL: [HookPoint; 4] = [
        HookPoint::Registered,
        HookPoint::BalancesUpdated,
        HookPoint::BeforeCommit,
        HookPoint::AfterCommit,
    ];

    /// `registered`, `balances-updated`, `before-commit`, `after-commit`.
    pub fn as_str(self) -> &'static str {
        match self {
            HookPoint::Registered => "registered",
            HookPoint::BalancesUpdated => "balances-updated",
            HookPoint::BeforeCommit => "before-commit",
            HookPoint::AfterCommit => "after-commit",
        }
    }
}

enum_names::name_traits!(HookPoint, "hook point");
enum_names::display_name!(EventKind);

/// What a hook sees.
#[derive(Clone, Copy)]
pub struct HookContext<'a> {
    /// The point being passed.
    pub point: HookPoint,
    /// The event's kind.
    pub event: EventKind,
    /// The tenant that scopes the business id.
    pub tenant_id: &'a str,
    /// The event's business id.
    pub business_id: &'a str,
    /// The open transaction; `None` at [`HookPoint::AfterCommit`].
    pub transaction: Option<&'a Transaction<'a>>,
}

impl fmt::Debug for HookContext<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookContext")
            .field("point", &self.point)
            .field("event", &self.event)
            .field("tenant_id", &self.tenant_id)
            .field("business_id", &self.business_id)
            .field("in_transaction", &self.transaction.is_some())
            .finish()
    }
}

/// A hook's request to abort the event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hook aborted the event: {reason}")]
pub struct HookAbort {
    /// Free text for logs.
    pub reason: String,
}

impl HookAbort {
    /// An abort with `reason`.
    pub fn new(reason: impl Into<String>) -> Self {
        HookAbort {
            reason: reason.into(),
        }
    }
}

/// Code run at each [`HookPoint`]. Before commit, `Err(HookAbort)` rolls the event back
/// and the call returns [`crate::FrozenError::HookAborted`]; at `after-commit` the event
/// stays committed and the call still returns that error (a lost response).
pub trait Hooks: Send + Sync {
    /// Called once per point passed.
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>>;
}

/// Hooks that do nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl Hooks for NoHooks {
    fn at<'a>(&'a self, _ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_names_round_trip() {
        for p in HookPoint::ALL {
            assert_eq!(p.as_str().parse::<HookPoint>(), Ok(p));
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("\"{}\"", p.as_str())
            );
        }
        assert!("balances_updated".parse::<HookPoint>().is_err());
    }
}
