//! The stand-in's routes and bodies (JSON), shared by the server and its clients.
//!
//! | route | body | answers |
//! |---|---|---|
//! | `POST /transfers` | [`Broadcast`] | 200 [`BroadcastAnswer`] (`CONFIRMED`, `new`); 422 `REJECTED` when refused; 409 when the id is known with another payload; or no answer at all (`drop`) |
//! | `GET /transfers/{id}` | — | 200 [`StatusAnswer`]; 404 `NOT_FOUND` |
//! | `GET /transfers` | — | 200 `{"transfers": [`[`TransferRecord`]`…]}` in arrival order |
//! | `GET /queries` | — | 200 `{"queries": [`[`QueryRecord`]`…]}`: every status query, in order |
//! | `PUT /control` | [`ControlRequest`] | 200: queues an action for the next `count` broadcasts; `release` is not queued: it ends the delays under way (`{"released": N}`) |
//! | `GET /control` | — | 200 [`ControlState`] |
//! | `PUT /deposits/{tx}` | [`DepositState`] | 200: the network now reports this incoming transfer so |
//! | `GET /deposits` | — | 200 `{"deposits": [`[`DepositState`]`…]}` in tx id order |
//!
//! Transfers and deposits are in the durable store; the control queue is in memory.

use serde::{Deserialize, Serialize};

/// Status of a transfer on the network: it went out, or it was refused.
pub const CONFIRMED: &str = "CONFIRMED";
/// The network refused the transfer (stored, so a later query says so too).
pub const REJECTED: &str = "REJECTED";
/// A status query for an id the network never received.
pub const NOT_FOUND: &str = "NOT_FOUND";

/// A broadcast: one transfer out, keyed by `id` (the withdrawal id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Broadcast {
    /// The idempotency key on the network.
    pub id: String,
    /// Destination address.
    pub destination: String,
    /// Asset name.
    pub asset: String,
    /// Minor units.
    pub amount: i64,
}

/// The answer to an accepted (or known) broadcast.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BroadcastAnswer {
    /// The id.
    pub id: String,
    /// `CONFIRMED` or `REJECTED`.
    pub status: String,
    /// Whether this broadcast created the transfer (false: the id was known, nothing new
    /// went out).
    pub new: bool,
}

/// The answer to a status query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusAnswer {
    /// The id asked about.
    pub id: String,
    /// `CONFIRMED`, `REJECTED` or `NOT_FOUND`.
    pub status: String,
}

/// One transfer in the network's store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferRecord {
    /// Arrival order, from 1.
    pub seq: i64,
    /// The id it was broadcast under.
    pub id: String,
    /// Destination.
    pub destination: String,
    /// Asset.
    pub asset: String,
    /// Minor units.
    pub amount: i64,
    /// `CONFIRMED` or `REJECTED`.
    pub status: String,
    /// Broadcasts received under this id (the first and every idempotent repeat).
    pub broadcasts: i64,
}

/// One status query the network answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueryRecord {
    /// Order, from 1.
    pub seq: i64,
    /// The id asked about.
    pub id: String,
    /// The answer given.
    pub status: String,
}

/// What the next broadcasts meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Store the transfer, then hold the answer for `delay_ms`.
    Delay,
    /// Store the transfer, then close the connection without an answer.
    Drop,
    /// Store the transfer as `REJECTED` and answer 422.
    Refuse,
    /// Not queued: ends every answer a `delay` holds right now, so a case can hold an
    /// answer for as long as it needs (a long `delay` is then only a safety bound) and
    /// let it go at a moment it chooses. `count` must still be at least 1.
    Release,
}

/// `PUT /control`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlRequest {
    /// The action.
    pub action: Action,
    /// For `delay`: how long, milliseconds (at most [`MAX_DELAY_MS`]).
    #[serde(default)]
    pub delay_ms: u64,
    /// How many of the next broadcasts it applies to (at least 1).
    pub count: u32,
}

/// Longest delay the stand-in accepts, milliseconds.
pub const MAX_DELAY_MS: u64 = 60_000;

/// `GET /control`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlState {
    /// Broadcast answers being held by a `delay` right now.
    pub holding: u32,
    /// Actions still queued (sum of their remaining counts).
    pub queued: u32,
}

/// An incoming transfer as the network reports it (`PUT /deposits/{tx}`, `GET /deposits`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepositState {
    /// The network's transaction id.
    pub tx_id: String,
    /// Tenant credited.
    pub tenant_id: String,
    /// Account credited.
    pub account_id: String,
    /// Asset name.
    pub asset: String,
    /// Minor units.
    pub amount: i64,
    /// Confirmations so far.
    pub confirmations: u32,
    /// Dropped from the network (a reorganisation).
    pub dropped: bool,
}
