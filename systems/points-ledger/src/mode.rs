//! Which of the three transfers a caller uses: SPEC §3's separate statements
//! ([`crate::transfer()`]), the one round trip ([`transfer_onetrip`]) or the batch
//! ([`crate::batch`]), and the calls that send a request by the chosen one.

use tokio_postgres::Client;

use crate::error::LedgerError;
use crate::onetrip::transfer_onetrip;
use crate::transfer::{Hooks, NoHooks, TransferRequest, TransferResult};
use crate::vocabulary::HookPoint;

/// How a transfer is sent to the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TransferMode {
    /// SPEC §3 as written: one transaction of separate statements, with every hook point
    /// ([`crate::transfer()`]).
    #[default]
    Statements,
    /// The same work in one statement calling `ledger_transfer_onetrip`
    /// ([`transfer_onetrip`]); only the `after-commit` hook point exists.
    OneTrip,
    /// Requests executed in batches by one server-side call over arrays
    /// ([`crate::batch::transfer_batch`]); collected by [`crate::batcher::Batcher`] in the
    /// service and the bench, a batch of one through [`transfer_in`]. Hook points:
    /// `before-commit` (once per request, the batch's transaction open) and `after-commit`.
    Batch,
}

impl TransferMode {
    /// Every mode, the default first.
    pub const ALL: [TransferMode; 3] = [
        TransferMode::Statements,
        TransferMode::OneTrip,
        TransferMode::Batch,
    ];

    /// The spelling of `--transfer-mode`: `statements`, `onetrip` or `batch`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransferMode::Statements => "statements",
            TransferMode::OneTrip => "onetrip",
            TransferMode::Batch => "batch",
        }
    }

    /// Whether `point` is passed by a transfer in this mode (in [`TransferMode::OneTrip`]
    /// only [`HookPoint::AfterCommit`]; in [`TransferMode::Batch`] also
    /// [`HookPoint::BeforeCommit`]).
    pub fn has_hook_point(self, point: HookPoint) -> bool {
        match self {
            TransferMode::Statements => true,
            TransferMode::OneTrip => point == HookPoint::AfterCommit,
            TransferMode::Batch => {
                matches!(point, HookPoint::BeforeCommit | HookPoint::AfterCommit)
            }
        }
    }
}

enum_names::name_traits!(TransferMode, "transfer mode");

/// [`crate::transfer()`], [`transfer_onetrip`] or a batch of one
/// ([`crate::batch::transfer_batch`], then its after-commit point), by `mode`.
///
/// Errors: those of the chosen function.
pub async fn transfer_in(
    mode: TransferMode,
    client: &mut Client,
    req: &TransferRequest,
    hooks: &dyn Hooks,
) -> Result<TransferResult, LedgerError> {
    match mode {
        TransferMode::Statements => crate::transfer::transfer(client, req, hooks).await,
        TransferMode::OneTrip => transfer_onetrip(client, req, hooks).await,
        TransferMode::Batch => {
            let answer = crate::batch::transfer_batch(client, std::slice::from_ref(req), hooks)
                .await
                .pop()
                .expect("one answer per request");
            crate::transfer::after_commit(hooks, req, answer?).await
        }
    }
}

/// [`crate::grant()`] in `mode`: a GRANT (`sys-issuer` → `account`) without hooks.
///
/// Errors: as [`transfer_in`].
pub async fn grant_in(
    mode: TransferMode,
    client: &mut Client,
    client_id: &str,
    idem_key: &str,
    account: &str,
    amount: i64,
) -> Result<TransferResult, LedgerError> {
    let req = TransferRequest::grant(client_id, idem_key, account, amount);
    transfer_in(mode, client, &req, &NoHooks).await
}

/// [`crate::debit()`] in `mode`: a DEBIT (`account` → `sys-redeem`) without hooks.
///
/// Errors: as [`transfer_in`].
pub async fn debit_in(
    mode: TransferMode,
    client: &mut Client,
    client_id: &str,
    idem_key: &str,
    account: &str,
    amount: i64,
) -> Result<TransferResult, LedgerError> {
    let req = TransferRequest::debit(client_id, idem_key, account, amount);
    transfer_in(mode, client, &req, &NoHooks).await
}

/// Environment variable naming the transfer mode (`statements`, `onetrip`, `batch`) of a run
/// that chose none, and the default of the harness's `--transfer-mode`.
pub const TRANSFER_MODE_ENV: &str = "LEDGER_TRANSFER_MODE";

impl TransferMode {
    /// The name under which a run records its transfer mode per case (`results.json`).
    pub const RECORD_NAME: &'static str = "transfer_mode";

    /// The mode named by [`TRANSFER_MODE_ENV`], or the default when it is unset.
    ///
    /// Panics: the variable names no mode (a misconfigured test run; the message names
    /// the variable and the value).
    pub fn from_env() -> TransferMode {
        match std::env::var(TRANSFER_MODE_ENV) {
            Ok(text) => text
                .parse()
                .unwrap_or_else(|error| panic!("{TRANSFER_MODE_ENV}={text:?}: {error}")),
            Err(_) => TransferMode::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_names_round_trip() {
        for mode in TransferMode::ALL {
            assert_eq!(mode.as_str().parse::<TransferMode>().unwrap(), mode);
        }
        assert!("one-trip".parse::<TransferMode>().is_err());
        assert!(TransferMode::OneTrip.has_hook_point(HookPoint::AfterCommit));
        assert!(!TransferMode::OneTrip.has_hook_point(HookPoint::BeforeCommit));
        assert!(TransferMode::Statements.has_hook_point(HookPoint::Registered));
        assert!(TransferMode::Batch.has_hook_point(HookPoint::BeforeCommit));
        assert!(!TransferMode::Batch.has_hook_point(HookPoint::Registered));
    }
}
