//! Frozen balances for exchange orders (SPEC §8), the balance side of a spot exchange on
//! PostgreSQL 16: an order freezes funds, each fill settles part of them, a cancel
//! releases the rest, and every one of those events happens once under retries, races
//! and crashes, with balances that reconcile per asset.
//!
//! - [`asset`]: assets (scale, maximum), the `BTC-USDT` market (tick, lot), sides.
//! - [`amount`]: decimal text at the edge, never rounded or truncated; notional, fee and
//!   fee reserve in checked 128-bit arithmetic.
//! - [`decisions`]: what every event decides on any engine: ids, payloads and their
//!   fingerprints, outcomes, balance changes in lock order, the check of a locked row,
//!   the replay of a stored record (shared with `frozen-balances-innodb`).
//! - [`schema`]: the tables and the seeded rows of a template database.
//! - [`events`]: [`place`], [`fill`], [`cancel`], [`deposit`], each one READ COMMITTED
//!   transaction that registers its business id first.
//! - [`hooks`]: the named points inside every event, for fault injection.
//! - [`reconcile`](mod@reconcile): the per-asset checks in one snapshot.
//! - [`query`]: balances and orders, for callers and cases.
//! - [`withdraw`]: withdrawals to an external network (request, outbox, settlement)
//!   and deposits reported by it with confirmations.
//!
//! Amounts are integer minor units (`i64`; `bigint` in the database), never floating point.

pub mod amount;
pub mod asset;
pub mod decisions;
pub mod error;
pub mod events;
pub mod hooks;
pub mod naive;
pub mod query;
pub mod reconcile;
pub mod reorg;
pub mod rules;
pub mod schema;
pub mod withdraw;

pub use asset::{Asset, Market, Side};
pub use error::FrozenError;
pub use events::{
    CancelRequest, CancelResult, DepositRequest, DepositResult, FillRequest, FillResult,
    OrderStatus, Outcome, PlaceRequest, PlaceResult, cancel, deposit, fill, place,
};
// The engine-independent parts a second engine (frozen-balances-innodb) shares.
pub use decisions::{
    Delta, Deltas, Event, EventRequest, LockedRow, LockedRows, Recorded, add_delta, check_change,
    check_id,
};
pub use events::{ORDER_COLUMNS, OrderRow, Settlement, buy_and_sell, settle};
pub use hooks::{EventKind, HookAbort, HookContext, HookPoint, Hooks, NoHooks};
pub use reconcile::{Findings, reconcile};
pub use schema::{DEFAULT_TENANT, SYS_DEPOSIT, SYS_FEE};
