//! The points ledger on PostgreSQL 16, a system under test (SPEC §2–§3): schema,
//! idempotent transfer, reconciliation, repair. Its HTTP service is `ledger-svc`.
//!
//! - [`schema`]: the four tables (SPEC §2), the one-trip transfer's function and the
//!   seeded accounts.
//! - [`mod@transfer`]: one READ COMMITTED transaction per request, at most once per
//!   `(client_id, idem_key)` (SPEC §3), with named hook points for fault injection.
//! - [`onetrip`]: the same transfer in one round trip (a server-side function).
//! - [`batch`]: many requests in one transaction by one call over arrays, each with its
//!   own outcome; [`batcher`] collects them from concurrent callers.
//! - [`mode`]: [`TransferMode`], which of the three a caller uses.
//! - [`mod@reconcile`]: the invariant checks of SPEC §6 L11 in one REPEATABLE READ snapshot.
//! - [`order_reconcile`]: the business reconciliation, orders against the debits that
//!   carry their order id.
//! - [`mod@repair`]: freeze, append adjustments, rewrite cached balances, re-check, unfreeze.
//! - [`mod@transfer_between`]: transfers between two user accounts, rows locked in sorted order.
//! - [`retention`]: the sweep that turns expired key records into tombstones.
//! - [`vocabulary`]: the transfer's kinds, outcomes and hook points.
//! - [`fingerprint`]: the request fingerprint compared on replay.
//! - [`error`]: the error type, [`LedgerError`].
//!
//! Amounts are integer points (`i64`), never floating point.

pub mod batch;
pub mod batcher;
pub mod error;
pub mod fingerprint;
pub mod mode;
pub mod naive;
pub mod onetrip;
pub mod order_reconcile;
pub mod reconcile;
pub mod repair;
pub mod retention;
pub mod schema;
pub mod striping;
pub mod transfer;
pub mod transfer_between;
pub mod vocabulary;

pub use error::LedgerError;
pub use fingerprint::request_hash;
pub use mode::{TRANSFER_MODE_ENV, TransferMode, debit_in, grant_in, transfer_in};
pub use onetrip::transfer_onetrip;
pub use order_reconcile::{Order, OrderFinding, reconcile_orders};
pub use reconcile::{
    BalanceMismatch, Findings, RequestRef, TxnRef, UnbalancedTxn, reconcile, reconcile_with,
};
pub use repair::{NoRepairHooks, RepairHooks, RepairLogLine, RepairReport, SYS_SUSPENSE, repair};
pub use schema::{SYS_ISSUER, SYS_REDEEM, TEST_ACCOUNT_COUNT, test_account};
pub use transfer::{
    HookAbort, HookContext, Hooks, NoHooks, TransferRequest, TransferResult, debit, grant,
    record_transfer, transfer,
};
pub use transfer_between::{between, lock_order, transfer_between};
pub use vocabulary::{HookPoint, Kind, Outcome, UnknownName};
