//! What every event decides whatever the engine runs it (SPEC §8): the ids it accepts,
//! its canonical payload and that payload's fingerprint, the outcome it records, the
//! balance changes it makes in lock order, the check of a locked row against them, and
//! the replay of a stored record. The events on PostgreSQL ([`crate::events`]) and
//! their InnoDB port (`frozen-balances-innodb`) both take these from here; only the
//! statements differ.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_postgres::Transaction;

use crate::amount::AmountError;
use crate::asset::Asset;
use crate::error::FrozenError;
use crate::hooks::{EventKind, HookContext, HookPoint, Hooks};

/// Longest tenant id, business id or account id, characters.
pub const MAX_ID_CHARS: usize = 255;
/// Leading SHA-256 bytes kept in a payload fingerprint.
pub const PAYLOAD_HASH_BYTES: usize = 16;

/// The recorded business outcome of an event (`balance_operation.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// The event took effect.
    Ok,
    /// A placement found less available than it must freeze; nothing moved.
    Insufficient,
    /// A fill or cancel named an order that is no longer open; nothing moved.
    OrderClosed,
}

impl Outcome {
    /// `OK`, `INSUFFICIENT`, `ORDER_CLOSED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "OK",
            Outcome::Insufficient => "INSUFFICIENT",
            Outcome::OrderClosed => "ORDER_CLOSED",
        }
    }

    /// The outcome stored as `text` (`OK`, `INSUFFICIENT`, `ORDER_CLOSED`); `None` for
    /// anything else (`PENDING`).
    pub fn parse(text: &str) -> Option<Outcome> {
        [Outcome::Ok, Outcome::Insufficient, Outcome::OrderClosed]
            .into_iter()
            .find(|o| o.as_str() == text)
    }
}

/// An order's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum OrderStatus {
    /// Holds a remainder of its freeze.
    Open,
    /// Filled completely; holds nothing.
    Filled,
    /// Cancelled; its remainder was released.
    Cancelled,
}

impl OrderStatus {
    /// `OPEN`, `FILLED`, `CANCELLED`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Open => "OPEN",
            OrderStatus::Filled => "FILLED",
            OrderStatus::Cancelled => "CANCELLED",
        }
    }

    /// The status stored as `text`.
    ///
    /// Errors: [`FrozenError::InvariantViolated`] for an unknown status.
    pub fn parse(text: &str) -> Result<OrderStatus, FrozenError> {
        [
            OrderStatus::Open,
            OrderStatus::Filled,
            OrderStatus::Cancelled,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
        .ok_or_else(|| FrozenError::InvariantViolated(format!("order status {text:?}")))
    }
}

/// The fingerprint of a canonical payload: SHA-256 of its UTF-8 text, the first
/// [`PAYLOAD_HASH_BYTES`] bytes as lower-case hex (32 characters).
pub fn payload_hash(payload: &str) -> String {
    let digest = Sha256::digest(payload.as_bytes());
    digest[..PAYLOAD_HASH_BYTES]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Checks a tenant id, business id or account id: 1 to [`MAX_ID_CHARS`] characters,
/// none of them a control character.
///
/// Errors: [`FrozenError::Invalid`] naming `what`.
pub fn check_id(what: &str, id: &str) -> Result<(), FrozenError> {
    if id.is_empty() || id.chars().count() > MAX_ID_CHARS || id.chars().any(char::is_control) {
        return Err(FrozenError::Invalid(format!(
            "{what} must have 1 to {MAX_ID_CHARS} characters and no control characters"
        )));
    }
    Ok(())
}

/// A request of one of the four business events: the kind it registers as, the
/// (tenant, business id) that makes it idempotent, and its canonical payload.
pub trait EventRequest {
    /// The kind stored in `balance_operation.kind`.
    const KIND: EventKind;
    /// The tenant that scopes the business id.
    fn tenant_id(&self) -> &str;
    /// The business id (for a fill, its fill id).
    fn business_id(&self) -> &str;
    /// The canonical payload, `KIND|field|field…` with amounts in minor units, whose
    /// fingerprint ([`payload_hash`]) tells a retry from a reuse of the business id.
    fn payload(&self) -> String;
}

/// A result recorded as JSON with its operation and returned again on replay.
pub trait Recorded: Serialize + DeserializeOwned {
    /// Marks the result as read back from an earlier request (`replayed = true`).
    fn mark_replayed(&mut self);

    /// The JSON text stored with the operation (`balance_operation.result`).
    ///
    /// Errors: [`FrozenError::InvariantViolated`] when it does not encode.
    fn encode(&self) -> Result<String, FrozenError> {
        serde_json::to_string(self)
            .map_err(|error| FrozenError::InvariantViolated(format!("result encoding: {error}")))
    }
}

/// Implements [`Recorded`] for result types with a `replayed: bool` field.
macro_rules! recorded {
    ($($t:ty),*) => {$(
        impl $crate::decisions::Recorded for $t {
            fn mark_replayed(&mut self) {
                self.replayed = true;
            }
        }
    )*};
}
pub(crate) use recorded;

/// One event being executed: what an engine needs besides the event's own work.
#[derive(Debug, Clone)]
pub struct Event<'r> {
    /// The kind it registers as.
    pub kind: EventKind,
    /// The tenant that scopes the business id.
    pub tenant_id: &'r str,
    /// The business id.
    pub business_id: &'r str,
    /// Canonical payload, `KIND|field|field…` with amounts in minor units.
    pub payload: String,
    /// Its fingerprint ([`payload_hash`]).
    pub hash: String,
}

impl<'r> Event<'r> {
    /// The event of `kind` for (`tenant_id`, `business_id`) with `payload`, fingerprinted.
    pub fn new(kind: EventKind, tenant_id: &'r str, business_id: &'r str, payload: String) -> Self {
        let hash = payload_hash(&payload);
        Event {
            kind,
            tenant_id,
            business_id,
            payload,
            hash,
        }
    }

    /// The event of `request`.
    pub fn of<Q: EventRequest>(request: &'r Q) -> Self {
        Event::new(
            Q::KIND,
            request.tenant_id(),
            request.business_id(),
            request.payload(),
        )
    }

    /// Runs hook `point`; `tx` is the PostgreSQL transaction the hook may look into
    /// (`None` after COMMIT, and always on another engine).
    ///
    /// Errors: [`FrozenError::HookAborted`] when the hook aborted.
    pub async fn hook(
        &self,
        hooks: &dyn Hooks,
        point: HookPoint,
        tx: Option<&Transaction<'_>>,
    ) -> Result<(), FrozenError> {
        let ctx = HookContext {
            point,
            event: self.kind,
            tenant_id: self.tenant_id,
            business_id: self.business_id,
            transaction: tx,
        };
        hooks
            .at(ctx)
            .await
            .map_err(|_| FrozenError::HookAborted(point))
    }

    /// The replay of this event from its stored record: the stored fingerprint, outcome
    /// and result (JSON text), compared and decoded, marked replayed.
    ///
    /// Errors: [`FrozenError::PayloadMismatch`] (another payload under the business id);
    /// [`FrozenError::CommittedPending`] (no outcome or no result stored);
    /// [`FrozenError::InvariantViolated`] (a result that does not decode).
    pub fn replay<R: Recorded>(
        &self,
        stored_hash: String,
        outcome: &str,
        result: Option<String>,
    ) -> Result<R, FrozenError> {
        if stored_hash != self.hash {
            return Err(FrozenError::PayloadMismatch {
                stored_hash,
                payload_hash: self.hash.clone(),
            });
        }
        let (Some(_), Some(result)) = (Outcome::parse(outcome), result) else {
            return Err(FrozenError::CommittedPending {
                tenant_id: self.tenant_id.to_owned(),
                business_id: self.business_id.to_owned(),
            });
        };
        let mut decoded: R = serde_json::from_str(&result).map_err(|error| {
            FrozenError::InvariantViolated(format!("stored result does not decode: {error}"))
        })?;
        decoded.mark_replayed();
        Ok(decoded)
    }

    /// The conflict whose stored record could not be read.
    pub fn unreadable(&self) -> FrozenError {
        FrozenError::InvariantViolated(format!(
            "operation ({}, {}) conflicted but could not be read",
            self.tenant_id, self.business_id
        ))
    }
}

/// One balance row's change inside an event, minor units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delta {
    /// Change of `available`.
    pub available: i64,
    /// Change of `frozen`.
    pub frozen: i64,
}

impl Delta {
    /// Whether the row does not change (no statement, no movement).
    pub fn is_zero(&self) -> bool {
        *self == Delta::default()
    }
}

/// The changes of one event, keyed and therefore iterated in lock order: sorted by
/// account id, then asset name (the tenant is the same for all rows of an event).
pub type Deltas = BTreeMap<(String, &'static str), Delta>;

/// Adds `available` and `frozen` to the change of (`account`, `asset`).
///
/// Errors: [`FrozenError::InvariantViolated`] when a sum overflows 64 bits.
pub fn add_delta(
    deltas: &mut Deltas,
    account: &str,
    asset: Asset,
    available: i64,
    frozen: i64,
) -> Result<(), FrozenError> {
    let entry = deltas
        .entry((account.to_owned(), asset.as_str()))
        .or_default();
    let overflow = || FrozenError::InvariantViolated("a delta overflows 64 bits".into());
    entry.available = entry
        .available
        .checked_add(available)
        .ok_or_else(overflow)?;
    entry.frozen = entry.frozen.checked_add(frozen).ok_or_else(overflow)?;
    Ok(())
}

/// A locked balance row, minor units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockedRow {
    /// `available` before the event.
    pub available: i64,
    /// `frozen` before the event.
    pub frozen: i64,
    /// Whether `available` may go below 0 (`sys-deposit`).
    pub allow_negative: bool,
}

/// The locked rows of an event, keyed as its [`Deltas`].
pub type LockedRows = BTreeMap<(String, &'static str), LockedRow>;

/// Checks that `delta` keeps every CHECK of the locked `row` of (`account`, `asset`):
/// frozen ≥ 0, available ≥ 0 unless `allow_negative`, no 64-bit overflow. A violation
/// is a bug, found before anything is written.
///
/// Errors: [`FrozenError::Amount`] (a balance past the 64-bit range: the request cannot
/// be done); [`FrozenError::InvariantViolated`] (a broken CHECK, an unknown asset).
pub fn check_change(
    account: &str,
    asset: &str,
    row: LockedRow,
    delta: &Delta,
) -> Result<(), FrozenError> {
    let (Some(available), Some(frozen)) = (
        row.available.checked_add(delta.available),
        row.frozen.checked_add(delta.frozen),
    ) else {
        // A request that would carry a balance past the bigint range (many maximal
        // deposits): the client's request cannot be done; nothing is recorded.
        let asset: Asset = asset
            .parse()
            .map_err(|_| FrozenError::InvariantViolated(format!("unknown asset {asset}")))?;
        return Err(FrozenError::Amount(AmountError::OutOfRange {
            what: "the balance after this event",
            asset,
        }));
    };
    if frozen < 0 || (!row.allow_negative && available < 0) {
        return Err(FrozenError::InvariantViolated(format!(
            "{account} {asset}: available {} frozen {} cannot take available {:+} frozen {:+}",
            row.available, row.frozen, delta.available, delta.frozen
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_hash_shape_and_vector() {
        // printf 'DEPOSIT|alice|USDT|10000000000' | sha256sum | cut -c1-32
        let h = payload_hash("DEPOSIT|alice|USDT|10000000000");
        assert_eq!(h, "20973e635cf07627df8e928c1cf31694");
        assert_ne!(h, payload_hash("DEPOSIT|alice|USDT|10000000001"));
    }

    #[test]
    fn deltas_iterate_in_lock_order_and_merge() {
        let mut d = Deltas::new();
        add_delta(&mut d, "sys-fee", Asset::Usdt, 5, 0).unwrap();
        add_delta(&mut d, "bob", Asset::Usdt, 1, 0).unwrap();
        add_delta(&mut d, "bob", Asset::Btc, 0, -1).unwrap();
        add_delta(&mut d, "alice", Asset::Usdt, 2, -3).unwrap();
        add_delta(&mut d, "alice", Asset::Usdt, 1, 0).unwrap();
        let keys: Vec<_> = d.keys().cloned().collect();
        assert_eq!(
            keys,
            vec![
                ("alice".to_owned(), "USDT"),
                ("bob".to_owned(), "BTC"),
                ("bob".to_owned(), "USDT"),
                ("sys-fee".to_owned(), "USDT"),
            ]
        );
        assert_eq!(
            d[&("alice".to_owned(), "USDT")],
            Delta {
                available: 3,
                frozen: -3
            }
        );
    }

    #[test]
    fn a_change_that_breaks_a_check_is_refused() {
        let row = LockedRow {
            available: 5,
            frozen: 0,
            allow_negative: false,
        };
        let take = |available, frozen| Delta { available, frozen };
        assert!(check_change("alice", "USDT", row, &take(-5, 5)).is_ok());
        assert!(matches!(
            check_change("alice", "USDT", row, &take(-6, 6)),
            Err(FrozenError::InvariantViolated(_))
        ));
        assert!(matches!(
            check_change("alice", "USDT", row, &take(i64::MAX, 0)),
            Err(FrozenError::Amount(_))
        ));
    }
}
