//! The case's transfer mode: the run's [`TransferMode`] choice
//! ([`case_kit::Ctx::choice`]; `./run.sh --transfer-mode`), or, in a test environment that
//! chose none, [`TransferMode::from_env`]; a case that needs an open transaction at a hook
//! point pins the statement mode ([`StatementsOnly`]). For [`points_ledger::transfer_in`],
//! [`points_ledger::debit_in`] and [`points_ledger::grant_in`].

use case_kit::{Case, Ctx};
use points_ledger::TransferMode;

/// The ledger's transfer mode for this case.
pub fn mode(ctx: &Ctx) -> TransferMode {
    ctx.choice::<TransferMode>()
        .unwrap_or_else(TransferMode::from_env)
}

/// A case that needs an open transaction at a hook point (a pause at `registered`, a
/// kill at `before-commit`), which exists only when transfers run as separate
/// statements (LIMITS.md, "The one-trip transfer").
pub trait StatementsOnly {
    /// Pins [`TransferMode::Statements`] for this case whatever the run's mode.
    fn statements_only(self) -> Case;
}

impl StatementsOnly for Case {
    fn statements_only(self) -> Case {
        self.pin(TransferMode::RECORD_NAME, TransferMode::Statements)
    }
}
