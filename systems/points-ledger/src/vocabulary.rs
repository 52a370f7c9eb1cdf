//! The transfer's vocabulary: its [`Kind`], its business [`Outcome`], and the named
//! [`HookPoint`]s inside it (SPEC §3), with their stored and wire spellings. A module of
//! its own so that the transfer, its errors and its fingerprint all depend on it and on
//! nothing of each other.

use serde::{Deserialize, Serialize};

/// The kind of a transfer, stored in `ledger_txn.kind` and part of the fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Kind {
    /// A user spends points: `from` = the user's account, `to` = [`crate::SYS_REDEEM`].
    Debit,
    /// Points are issued to a user: `from` = [`crate::SYS_ISSUER`], `to` = the user's account.
    Grant,
    /// Points move between two user accounts ([`crate::transfer_between()`]): both rows
    /// are locked in sorted order, not `from` then `to`.
    Transfer,
}

impl Kind {
    /// Every kind, in declaration order.
    pub const ALL: [Kind; 3] = [Kind::Debit, Kind::Grant, Kind::Transfer];

    /// The stored spelling: `"DEBIT"`, `"GRANT"` or `"TRANSFER"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Debit => "DEBIT",
            Kind::Grant => "GRANT",
            Kind::Transfer => "TRANSFER",
        }
    }
}

/// The business outcome of a transfer, stored in `idem_request.outcome` and replayed for
/// every retry with the same key. (The fourth stored value, `PENDING`, only exists inside
/// the registering transaction and is never an outcome.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    /// The points moved; a `ledger_txn` with two entries exists (HTTP 201).
    Ok,
    /// `from` exists but its balance was below the amount and it may not go negative (HTTP 409).
    Insufficient,
    /// `from` does not exist (HTTP 404).
    NoAccount,
}

impl Outcome {
    /// All outcomes, in declaration order.
    pub const ALL: [Outcome; 3] = [Outcome::Ok, Outcome::Insufficient, Outcome::NoAccount];

    /// The stored spelling: `"OK"`, `"INSUFFICIENT"` or `"NO_ACCOUNT"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "OK",
            Outcome::Insufficient => "INSUFFICIENT",
            Outcome::NoAccount => "NO_ACCOUNT",
        }
    }
}

/// A named point inside [`crate::transfer()`] where [`crate::Hooks::at`] is called (SPEC §3),
/// used by fault injection and the crash-worker. In normal operation ([`crate::NoHooks`])
/// nothing happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HookPoint {
    /// After the `idem_request` row was inserted as `PENDING` (this transaction now holds the
    /// key; a concurrent same-key request waits), before any balance is touched.
    Registered,
    /// After the debit, the credit, the `ledger_txn` row and its two `ledger_entry` rows were
    /// written, before the outcome is recorded. Only reached on the OK path.
    EntriesWritten,
    /// Immediately before `COMMIT`, with the outcome recorded. Reached on every path that
    /// commits (OK, INSUFFICIENT, NO_ACCOUNT).
    BeforeCommit,
    /// After `COMMIT` succeeded (the point of no return), before the result is returned;
    /// in the service, before the response is written. No transaction any more.
    AfterCommit,
}

impl HookPoint {
    /// All points, in the order a successful transfer passes them.
    pub const ALL: [HookPoint; 4] = [
        HookPoint::Registered,
        HookPoint::EntriesWritten,
        HookPoint::BeforeCommit,
        HookPoint::AfterCommit,
    ];

    /// The name: `"registered"`, `"entries-written"`, `"before-commit"` or `"after-commit"`.
    pub fn as_str(self) -> &'static str {
        match self {
            HookPoint::Registered => "registered",
            HookPoint::EntriesWritten => "entries-written",
            HookPoint::BeforeCommit => "before-commit",
            HookPoint::AfterCommit => "after-commit",
        }
    }
}

enum_names::name_traits!(Kind, "transfer kind");
enum_names::name_traits!(Outcome, "outcome");
enum_names::name_traits!(HookPoint, "hook point");

/// Parse error of the `FromStr` impls of [`Kind`], [`Outcome`] and [`HookPoint`] (the
/// systems' one, [`enum_names::UnknownName`]).
pub use enum_names::UnknownName;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for k in Kind::ALL {
            assert_eq!(k.as_str().parse::<Kind>(), Ok(k));
        }
        for o in Outcome::ALL {
            assert_eq!(o.as_str().parse::<Outcome>(), Ok(o));
        }
        for p in HookPoint::ALL {
            assert_eq!(p.as_str().parse::<HookPoint>(), Ok(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        assert!("debit".parse::<Kind>().is_err());
        assert!("PENDING".parse::<Outcome>().is_err());
        assert_eq!(
            "entries_written"
                .parse::<HookPoint>()
                .unwrap_err()
                .to_string(),
            "unknown hook point: \"entries_written\""
        );
    }

    #[test]
    fn serde_spellings_match_as_str() {
        assert_eq!(
            serde_json::to_string(&Outcome::NoAccount).unwrap(),
            "\"NO_ACCOUNT\""
        );
        assert_eq!(serde_json::to_string(&Kind::Grant).unwrap(), "\"GRANT\"");
        assert_eq!(
            serde_json::to_string(&HookPoint::EntriesWritten).unwrap(),
            "\"entries-written\""
        );
    }
}
